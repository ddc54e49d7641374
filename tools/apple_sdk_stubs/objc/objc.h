// Stand-in for the macOS SDK's <objc/objc.h> (declarations only; see ../README.md).
#pragma once

typedef struct objc_class* Class;
struct objc_object {
  Class isa;
};
typedef struct objc_object* id;
typedef struct objc_selector* SEL;
