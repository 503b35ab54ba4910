// The resource budget of one render: bytes of strings and containers alive, bytes of one value,
// work done by value walks (str, repr, tojson, comparisons) and a wall-clock deadline. A
// template is untrusted input (it may come from a GGUF file), so every value it builds is
// counted here, not only the output. Owns no values; value.cc charges it, the renderer reads it.
//
// NOTE: the budget is found through a thread-local pointer that a BudgetScope sets for the
// duration of a render, so Value's constructors and walks need no extra argument. Values made
// outside any render (the caller's context) are not counted.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace gale::jinja {

struct RenderBudget {
  int64_t max_live_bytes = 256 << 20;   // strings, list items and dict entries alive at once
  int64_t max_value_bytes = 16 << 20;   // one string (or one builder's output)
  // CPU time of the rendering thread after which the render stops (a busy server's other threads
  // do not eat into it): ThreadCpuTime() at the start plus the render's max_time.
  std::chrono::nanoseconds cpu_deadline = std::chrono::nanoseconds::max();

  int64_t live_bytes = 0;
  int64_t work = 0;           // walk steps since the last deadline check
  std::string exceeded;       // empty while within every limit; else what was exceeded

  void Exceed(std::string why) {
    if (exceeded.empty()) exceeded = std::move(why);
  }
  bool ok() const { return exceeded.empty(); }
  // Checks the deadline; false (and marked) once it has passed.
  bool CheckDeadline();
};

// CPU time this thread has used.
std::chrono::nanoseconds ThreadCpuTime();

// The budget of the render running on this thread, or null.
std::shared_ptr<RenderBudget> CurrentBudget();

// Makes `budget` current on this thread until destroyed (restoring the previous one).
class BudgetScope {
 public:
  explicit BudgetScope(std::shared_ptr<RenderBudget> budget);
  ~BudgetScope();
  BudgetScope(const BudgetScope&) = delete;
  BudgetScope& operator=(const BudgetScope&) = delete;

 private:
  std::shared_ptr<RenderBudget> previous_;
};

// Walks call this per element or per 64 bytes compared or written: false once the current
// budget is exceeded (the walk then stops early; the renderer reports the budget's reason).
bool ChargeWork(int64_t units = 1);
// A builder about to make a string of `bytes`: false (and the budget marked) when that is over
// the current budget's max_value_bytes. Always true outside a render.
bool CanBuild(size_t bytes);

}  // namespace gale::jinja
