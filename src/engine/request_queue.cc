// Request queue and result streams: mutex + condition variable each.
#include "engine/request_queue.h"

namespace gale {

std::optional<std::chrono::steady_clock::time_point> RequestStream::first_token_at() {
  std::lock_guard<std::mutex> lock(mu_);
  return first_token_at_;
}

void RequestStream::SetNotify(std::function<void()> notify) {
  std::lock_guard<std::mutex> lock(mu_);
  notify_ = std::move(notify);
}

bool RequestStream::TryNext(StreamUpdate* out) {
  return NextUntil(std::chrono::steady_clock::time_point::min(), out);
}

void RequestStream::Push(StreamUpdate u) {
  std::function<void()> notify;
  {
    std::lock_guard<std::mutex> lock(mu_);
    notify = notify_;
    if (!first_token_at_ && !u.token_ids.empty()) first_token_at_ = std::chrono::steady_clock::now();
    if (!has_pending_) {
      pending_ = std::move(u);
      has_pending_ = true;
    } else {
      pending_.token_ids.insert(pending_.token_ids.end(), u.token_ids.begin(), u.token_ids.end());
      pending_.logprobs.insert(pending_.logprobs.end(), u.logprobs.begin(), u.logprobs.end());
      pending_.prompt_logprobs.insert(pending_.prompt_logprobs.end(), u.prompt_logprobs.begin(), u.prompt_logprobs.end());
      pending_.text += u.text;
      if (u.finished) {
        pending_.finished = true;
        pending_.finish_reason = u.finish_reason;
        pending_.status = std::move(u.status);
        pending_.request_error = u.request_error;
        pending_.stop_string = std::move(u.stop_string);
        pending_.embedding = std::move(u.embedding);
      }
      pending_.num_prompt_tokens = u.num_prompt_tokens;
      pending_.num_truncated_tokens = u.num_truncated_tokens;
      pending_.num_cached_tokens = u.num_cached_tokens;
      pending_.num_evicted_tokens = u.num_evicted_tokens;
      pending_.kv_budget = u.kv_budget;
    }
  }
  cv_.notify_all();
  if (notify) notify();
}

bool RequestStream::Next(StreamUpdate* out) {
  return NextUntil(std::chrono::steady_clock::time_point::max(), out);
}

bool RequestStream::NextUntil(std::chrono::steady_clock::time_point deadline, StreamUpdate* out) {
  std::unique_lock<std::mutex> lock(mu_);
  if (done_) return false;
  if (deadline == std::chrono::steady_clock::time_point::max()) {
    cv_.wait(lock, [&] { return has_pending_; });
  } else if (!cv_.wait_until(lock, deadline, [&] { return has_pending_; })) {
    return false;
  }
  *out = std::move(pending_);
  pending_ = StreamUpdate();
  has_pending_ = false;
  if (out->finished) done_ = true;
  return true;
}

bool RequestQueue::Submit(PendingRequest req) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_) return false;
    submitted_.push_back(std::move(req));
  }
  cv_.notify_one();
  return true;
}

void RequestQueue::Cancel(int64_t id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_.push_back(id);
  }
  cv_.notify_one();
}

void RequestQueue::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
  }
  cv_.notify_one();
  paused_cv_.notify_all();
}

void RequestQueue::Pause() {
  std::unique_lock<std::mutex> lock(mu_);
  paused_ = true;
  cv_.notify_one();  // an idle engine waiting for work comes round to hold
  paused_cv_.wait(lock, [&] { return holding_ || shutdown_; });
}

void RequestQueue::Resume() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    paused_ = false;
  }
  cv_.notify_one();
}

bool RequestQueue::Drain(bool wait, std::vector<PendingRequest>* submitted, std::vector<int64_t>* cancelled) {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    if (paused_ && !shutdown_) {
      holding_ = true;
      paused_cv_.notify_all();
      cv_.wait(lock, [&] { return shutdown_ || !paused_; });
      holding_ = false;
    }
    if (!wait || shutdown_ || !submitted_.empty() || !cancelled_.empty()) break;
    cv_.wait(lock, [&] { return shutdown_ || paused_ || !submitted_.empty() || !cancelled_.empty(); });
  }
  for (auto& r : submitted_) submitted->push_back(std::move(r));
  submitted_.clear();
  cancelled->insert(cancelled->end(), cancelled_.begin(), cancelled_.end());
  cancelled_.clear();
  return !shutdown_;
}

bool RequestQueue::WaitFor(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return shutdown_ || paused_ || !submitted_.empty() || !cancelled_.empty(); });
}

}  // namespace gale
