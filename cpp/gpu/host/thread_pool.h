// A fixed pool of OS threads that all run the same job; the calling thread
// takes part as worker 0, so a one-core machine needs no extra thread.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace mkv::host {

class ThreadPool {
 public:
  explicit ThreadPool(int workers);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(threads_.size()) + 1; }
  // Runs job(worker_index) on every worker and returns when all are done.
  // Calls from several threads are serialized.
  void run(const std::function<void(int)>& job);

 private:
  void loop(int index);

  std::vector<std::thread> threads_;
  std::mutex run_mutex_;  // one job at a time
  std::mutex mutex_;
  std::condition_variable start_, done_;
  const std::function<void(int)>* job_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

}  // namespace mkv::host
