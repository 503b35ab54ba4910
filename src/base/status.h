// Status and StatusOr<T>: the error currency at every boundary that sees outside data (files,
// HTTP, CLI). A Status carries a code and a message that says what was wrong, where, and what
// would fix it. This file does not log or throw; callers decide what to do with an error.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <utility>
#include <variant>

#include <fmt/format.h>

namespace gale {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,
  kNotFound,
  kOutOfRange,
  kDataLoss,        // a file is truncated or corrupt
  kUnimplemented,
  kResourceExhausted,
  kInternal,
  kIoError,
  kUnavailable,     // a peer (another rank of a distributed model) stopped answering, or was stopped
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string ToString() const;

  // Returns a copy with "context: " in front of the message; for adding where an error happened.
  Status WithContext(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

template <typename... Args>
Status InvalidArgument(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kInvalidArgument, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status DataLoss(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kDataLoss, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status NotFound(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kNotFound, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status Unimplemented(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kUnimplemented, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status IoError(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kIoError, fmt::format(f, std::forward<Args>(args)...));
}

template <typename... Args>
Status Unavailable(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kUnavailable, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status Internal(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kInternal, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status ResourceExhausted(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kResourceExhausted, fmt::format(f, std::forward<Args>(args)...));
}

template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(Status status) : status_(std::move(status)) { assert(!status_.ok()); }  // NOLINT
  StatusOr(T value) : value_(std::move(value)) {}                                  // NOLINT

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace gale

#define GALE_CONCAT_INNER(a, b) a##b
#define GALE_CONCAT(a, b) GALE_CONCAT_INNER(a, b)

#define RETURN_IF_ERROR(expr)                 \
  do {                                        \
    ::gale::Status gale_status_ = (expr);     \
    if (!gale_status_.ok()) return gale_status_; \
  } while (0)

#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                          \
  if (!tmp.ok()) return tmp.status();         \
  lhs = std::move(tmp).value()

#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL(GALE_CONCAT(gale_statusor_, __LINE__), lhs, expr)
