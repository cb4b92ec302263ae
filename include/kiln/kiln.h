#pragma once
// Build-tree forwarder so that in-tree programs include <kiln/kiln.h> exactly as installed
// host applications do.
#include "../../frontend/kiln.h"
