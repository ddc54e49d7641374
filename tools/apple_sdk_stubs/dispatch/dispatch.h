// Stand-in for the macOS SDK's <dispatch/dispatch.h> (see ../README.md): the two object
// types metal-cpp names, declared as DISPATCH_DECL does outside Objective-C.
#pragma once

typedef struct dispatch_queue_s* dispatch_queue_t;
typedef struct dispatch_data_s* dispatch_data_t;
