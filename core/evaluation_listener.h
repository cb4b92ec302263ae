#pragma once
// Progress of an evaluation, told as it happens to whoever asked on the evaluating thread.
// dist::DataParallel uses it to start a bucket's all-reduce as soon as the backward pass
// has produced that bucket's gradients, while later kernels of the same evaluation run.
#include <memory>

#include "node.h"

namespace kiln {

/// Receives an evaluation's progress. Callbacks run on the evaluating thread between
/// kernels; they must not evaluate tensors and must not throw (keep an error for later).
class EvaluationListener {
 public:
  virtual ~EvaluationListener() = default;
  /// `requested` (a node of the evaluation's request) has its final value in `value`, before
  /// the evaluation ends; at most once per node. Values that an executor attaches only at
  /// the end (the reference evaluator's, a value simplify proved equal to an input) are
  /// never announced: the caller reads those after the evaluation.
  virtual void value_ready(const Node& requested, const std::shared_ptr<Buffer>& value) = 0;
  /// One kernel of the evaluation has finished (a chance to poll work in flight).
  virtual void kernel_done() {}
};

/// While alive, evaluations on this thread report to `listener`; scopes nest (innermost
/// wins) and restore the previous listener when they end.
class ScopedEvaluationListener {
 public:
  explicit ScopedEvaluationListener(EvaluationListener& listener);
  ~ScopedEvaluationListener();
  ScopedEvaluationListener(const ScopedEvaluationListener&) = delete;
  ScopedEvaluationListener& operator=(const ScopedEvaluationListener&) = delete;

 private:
  EvaluationListener* previous_;
};

/// The listener of evaluations on this thread, or nullptr.
EvaluationListener* evaluation_listener();

}  // namespace kiln
