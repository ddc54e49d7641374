// Stand-in for the macOS SDK's <TargetConditionals.h> (see README.md): a macOS target.
#pragma once

#define TARGET_OS_MAC 1
#define TARGET_OS_OSX 1
#define TARGET_OS_IPHONE 0
