// Stand-in for the macOS SDK's <Availability.h> (see README.md).
//
// __MAC_OS_X_VERSION_MIN_REQUIRED is the deployment target (Apple's clang derives it from
// -mmacosx-version-min); metal-cpp's MTL::CopyAllDevices() returns nil below 10.11.
// __MAC_26_0 exists only in macOS 26 SDKs, and metal-cpp picks how it loads its string
// constants by it: check_metal_backend.py compiles the implementation unit once per SDK
// generation by setting METALKV_STUB_MACOS_SDK (default: 260000, a macOS 26 SDK).
#pragma once

#ifndef METALKV_STUB_MACOS_SDK
#define METALKV_STUB_MACOS_SDK 260000
#endif
#if METALKV_STUB_MACOS_SDK >= 260000
#define __MAC_26_0 260000
#endif

#ifndef __MAC_OS_X_VERSION_MIN_REQUIRED
#define __MAC_OS_X_VERSION_MIN_REQUIRED 140000
#endif
