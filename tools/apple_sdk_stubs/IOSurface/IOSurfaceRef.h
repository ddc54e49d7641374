// Stand-in for the macOS SDK's <IOSurface/IOSurfaceRef.h> (see ../README.md).
#pragma once

typedef struct __IOSurface* IOSurfaceRef;
