#pragma once
// kiln::nn: modules, layers, functional ops, initialisation and losses.
#include "container.h"
#include "conv.h"
#include "flash_attention.h"
#include "functional.h"
#include "init.h"
#include "linear.h"
#include "loss.h"
#include "module.h"
#include "normalization.h"
#include "rnn.h"
#include "transformer.h"
