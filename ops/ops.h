#pragma once
// Every op a user can build: meta-ops and the compositions on top of them.
#include "autocast.h"
#include "autograd.h"
#include "elementwise.h"
#include "linalg.h"
#include "reduce_ops.h"
#include "reference.h"
#include "reindex.h"
#include "selection.h"
#include "shape_ops.h"
#include "sources.h"
#include "transfer.h"
