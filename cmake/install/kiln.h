#pragma once
// The public API of the installed package: include this one header and link kiln::kiln.
// Installed as <prefix>/include/kiln/kiln.h next to the folders it includes from.
#include "frontend/kiln.h"
