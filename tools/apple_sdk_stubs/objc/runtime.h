// Stand-in for the macOS SDK's <objc/runtime.h> (declarations only; see ../README.md).
#pragma once

#include <objc/objc.h>

typedef struct objc_object Protocol;  // as the SDK declares it outside Objective-C

#ifdef __cplusplus
extern "C" {
#endif
Class objc_lookUpClass(const char* name);
Protocol* objc_getProtocol(const char* name);
SEL sel_registerName(const char* str);
#ifdef __cplusplus
}
#endif
