// Stand-in for the macOS SDK's <objc/message.h> (declarations only; see ../README.md).
// The untyped prototypes of OBJC_OLD_DISPATCH_PROTOTYPES=0, the SDK's default: callers
// cast them to the method's real signature, as metal-cpp does. The _stret/_fpret forms
// exist on x86_64 only, which is what this check compiles for.
#pragma once

#include <objc/objc.h>

#ifdef __cplusplus
extern "C" {
#endif
void objc_msgSend(void);
void objc_msgSend_stret(void);
void objc_msgSend_fpret(void);
#ifdef __cplusplus
}
#endif
