// SPDX-License-Identifier: Apache-2.0
#pragma once
// A second process for UCX tests and benchmarks: the running binary started again (fork, then exec of
// /proc/self/exe, so the child starts with no UCX state of the parent's) with an environment variable that sends it
// to its role, which listens on the loopback and reports the port through a pipe. The parent's side reaps it
// (killing it first when it outlives a bounded wait).
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>

#include "kvpager/transfer/ucx_transport.hpp"

namespace kvpager::testing {

/// The child's side: listens on 127.0.0.1 (any port), writes the port to `fd` (then closes it) and accepts one
/// peer within `timeout`. The peer, or the first error.
inline result<peer_handle> listen_report_accept(ucx_transport& t, int fd, std::chrono::milliseconds timeout) {
  const result<std::uint16_t> port = t.listen("127.0.0.1", 0);
  if (!port.ok()) return port.error();
  const std::uint16_t v = *port;
  const bool wrote = write(fd, &v, sizeof(v)) == static_cast<ssize_t>(sizeof(v));
  close(fd);
  if (!wrote) return status{errc::transport_error, "listen_report_accept: cannot write the port"};
  return t.accept(timeout);
}

/// The parent's side: this binary started again with `env` set to "<write fd>" followed by `more`; `port` is what
/// the child reported (0: it did not, within 30 s).
struct peer_process {
  pid_t pid = -1;
  std::uint16_t port = 0;

  peer_process(const char* env, const std::string& more) {
    int fds[2];
    if (pipe(fds) != 0) return;
    const std::string value = std::to_string(fds[1]) + more;
    pid = fork();
    if (pid == 0) {
      close(fds[0]);
      setenv(env, value.c_str(), 1);
      execl("/proc/self/exe", "kvpager_peer_process", static_cast<char*>(nullptr));
      _exit(9);
    }
    close(fds[1]);
    pollfd pf{fds[0], POLLIN, 0};
    if (pid > 0 && ::poll(&pf, 1, 30000) == 1 && read(fds[0], &port, sizeof(port)) != static_cast<ssize_t>(sizeof(port)))
      port = 0;
    close(fds[0]);
  }
  peer_process(const peer_process&) = delete;
  peer_process& operator=(const peer_process&) = delete;

  /// Waits (at most `wait`, then kills) for the process: its exit status, or -1 when it was killed.
  int reap(std::chrono::milliseconds wait = std::chrono::milliseconds(20000)) {
    if (pid <= 0) return -1;
    int st = 0;
    const auto until = std::chrono::steady_clock::now() + wait;
    while (std::chrono::steady_clock::now() < until) {
      if (waitpid(pid, &st, WNOHANG) == pid) {
        pid = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    pid = -1;
    return -1;
  }
  void kill_now() const {
    if (pid > 0) kill(pid, SIGKILL);
  }
  ~peer_process() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      int st = 0;
      waitpid(pid, &st, 0);
    }
  }
};

}  // namespace kvpager::testing
