// Stand-in for the macOS SDK's <CoreFoundation/CoreFoundation.h> (see ../README.md).
//
// The real header pulls in the C library headers below, TargetConditionals, Availability
// and (through CFStream.h) libdispatch; code that compiles on a Mac may rely on any of
// them, and older metal-cpp releases do (dispatch_queue_t in MTLEvent.hpp).
#pragma once

#include <Availability.h>
#include <TargetConditionals.h>
#include <assert.h>
#include <ctype.h>
#include <dispatch/dispatch.h>
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

typedef double CFTimeInterval;
