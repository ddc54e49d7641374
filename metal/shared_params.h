// Included first by every *_params.h, the headers the kernels (MSL) and the
// C++ ops both read. MKV_CONSTANT declares a geometry or format constant:
// MSL wants program-scope constants in the constant address space, C++ an
// inline variable (one definition across translation units).
#pragma once

#ifndef __METAL_VERSION__
#include <cstdint>
#define MKV_CONSTANT inline constexpr
#else
#define MKV_CONSTANT constant constexpr
#endif
