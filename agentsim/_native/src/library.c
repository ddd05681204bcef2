/* What the library was built from (agentsim_build_info): the build defines AGENTSIM_BUILD_INFO. */
#include "agentsim_kernels.h"

#ifndef AGENTSIM_BUILD_INFO
#define AGENTSIM_BUILD_INFO "unknown"
#endif

const char *agentsim_build_info(void) { return AGENTSIM_BUILD_INFO; }
