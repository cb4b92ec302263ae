#include "core/evaluation_listener.h"

namespace kiln {
namespace {
thread_local EvaluationListener* t_listener = nullptr;
}  // namespace

ScopedEvaluationListener::ScopedEvaluationListener(EvaluationListener& listener)
    : previous_(t_listener) {
  t_listener = &listener;
}

ScopedEvaluationListener::~ScopedEvaluationListener() { t_listener = previous_; }

EvaluationListener* evaluation_listener() { return t_listener; }

}  // namespace kiln
