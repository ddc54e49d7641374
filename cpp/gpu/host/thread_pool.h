// A fixed pool of OS threads that all run the same job; the calling thread
// takes part as worker 0, so a one-core machine needs no extra thread.
//
// A decode step is a few hundred short dispatches, each one job: waking a
// sleeping thread per job (a futex round trip, tens of microseconds on a busy
// machine) cost as much as the smaller kernels. So the workers spin for a
// while (kSpin) on the job counter before they sleep, and so does the caller
// waiting for the last worker.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
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

  // How long a thread spins for the next job (or the caller for the last
  // worker) before it sleeps.
  static constexpr std::chrono::microseconds kSpin{200};

 private:
  void loop(int index);

  std::vector<std::thread> threads_;
  std::mutex run_mutex_;  // one job at a time
  std::mutex mutex_;      // guards the sleeps below
  std::condition_variable start_, done_;
  const std::function<void(int)>* job_ = nullptr;  // published by generation_
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};  // workers (besides the caller) still running the job
  std::atomic<bool> stop_{false};
};

}  // namespace mkv::host
