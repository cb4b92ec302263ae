#pragma once
// Every op a user can build: meta-ops and the compositions on top of them.
#include "elementwise.h"
#include "reference.h"
#include "reindex.h"
#include "sources.h"
