// Stand-in for the macOS SDK's <mach/mach.h> (see ../README.md): the types of
// MTL::Resource::setOwner().
#pragma once

typedef int kern_return_t;
typedef unsigned int mach_port_t;
typedef mach_port_t task_id_token_t;
