#include "dist/communicator.h"

#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <tuple>

#include "base/tree_sum.h"

namespace gale::dist {

Status Communicator::Broadcast(int root, std::vector<uint8_t>* bytes, const Wait& wait, int tag) {
  if (rank() == root) {
    for (int r = 0; r < size(); ++r) {
      if (r != root) RETURN_IF_ERROR(Send(r, tag, *bytes));
    }
    return Status::Ok();
  }
  ASSIGN_OR_RETURN(*bytes, Recv(root, tag, wait));
  return Status::Ok();
}

Status Communicator::AllReduceSum(std::span<float> x, const Wait& wait, int tag) {
  const size_t num_bytes = x.size() * sizeof(float);
  if (rank() != 0) {
    std::vector<uint8_t> mine(num_bytes);
    std::memcpy(mine.data(), x.data(), num_bytes);
    RETURN_IF_ERROR(Send(0, tag, std::move(mine)));
  } else {
    std::vector<std::vector<uint8_t>> theirs(static_cast<size_t>(size()));
    std::vector<float*> parts = {x.data()};
    for (int r = 1; r < size(); ++r) {
      ASSIGN_OR_RETURN(theirs[r], Recv(r, tag, wait));
      if (theirs[r].size() != num_bytes) {
        return Internal("all-reduce: rank {} sent {} bytes, expected {}", r, theirs[r].size(), num_bytes);
      }
      parts.push_back(reinterpret_cast<float*>(theirs[r].data()));
    }
    TreeSum(parts, x.size());
  }
  std::vector<uint8_t> sum(num_bytes);
  if (rank() == 0) std::memcpy(sum.data(), x.data(), num_bytes);
  RETURN_IF_ERROR(Broadcast(0, &sum, wait, tag));
  if (sum.size() != num_bytes) return Internal("all-reduce: the sum has {} bytes, expected {}", sum.size(), num_bytes);
  std::memcpy(x.data(), sum.data(), num_bytes);
  return Status::Ok();
}

namespace {

// Mailboxes keyed by (src, dst, tag), shared by a LocalGroup's ranks.
struct Mailboxes {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::tuple<int, int, int>, std::deque<std::vector<uint8_t>>> queues;
};

class LocalCommunicator : public Communicator {
 public:
  LocalCommunicator(std::shared_ptr<Mailboxes> boxes, int rank, int size)
      : boxes_(std::move(boxes)), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Status Send(int dest, int tag, std::vector<uint8_t> bytes) override {
    if (dest < 0 || dest >= size_) return InvalidArgument("send to rank {} of {}", dest, size_);
    {
      std::lock_guard<std::mutex> lock(boxes_->mu);
      boxes_->queues[{rank_, dest, tag}].push_back(std::move(bytes));
    }
    boxes_->cv.notify_all();
    return Status::Ok();
  }

  StatusOr<std::vector<uint8_t>> Recv(int src, int tag, const Wait& wait) override {
    if (src < 0 || src >= size_) return InvalidArgument("receive from rank {} of {}", src, size_);
    const auto start = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lock(boxes_->mu);
    auto& q = boxes_->queues[{src, rank_, tag}];
    while (q.empty()) {
      if (wait.cancel != nullptr && wait.cancel->load()) return Unavailable("stopped while waiting for rank {}", src);
      if (wait.timeout.count() >= 0 && std::chrono::steady_clock::now() - start >= wait.timeout) {
        return Unavailable("rank {} sent nothing within {} ms", src, wait.timeout.count());
      }
      boxes_->cv.wait_for(lock, std::chrono::milliseconds(5));
    }
    std::vector<uint8_t> m = std::move(q.front());
    q.pop_front();
    return m;
  }

  Status Flush(const Wait&) override { return Status::Ok(); }

 private:
  std::shared_ptr<Mailboxes> boxes_;
  int rank_, size_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> LocalGroup(int n) {
  auto boxes = std::make_shared<Mailboxes>();
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < n; ++r) out.push_back(std::make_unique<LocalCommunicator>(boxes, r, n));
  return out;
}

}  // namespace gale::dist
