// SPDX-License-Identifier: Apache-2.0
// kv_event_publisher (monitor/kv_event_publisher.hpp) in process, over loopback TCP: vLLM's bind rule and data-parallel
// endpoint offsets, the frames a subscriber receives (topic, 8-byte big-endian sequence from 0, the encoded batch with
// the rank), the replay protocol (every kept batch from a start, then the end marker; a start older than the ring),
// and bad options refused. Bounded waits; every socket and publisher closed by the test.
#include <kvpager/monitor/kv_event_encoding.hpp>
#include <kvpager/monitor/kv_event_publisher.hpp>

#include <gtest/gtest.h>
#include <zmq.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

using namespace kvpager;

namespace {

std::vector<std::string> recv_all(void* socket, int timeout_ms) {
  std::vector<std::string> frames;
  zmq_pollitem_t item{socket, 0, ZMQ_POLLIN, 0};
  if (zmq_poll(&item, 1, timeout_ms) > 0) detail::receive_frames(socket, frames);
  return frames;
}

/// A free loopback port: bind a socket to an ephemeral port and read it back.
int bound_port(void* socket) {
  if (zmq_bind(socket, "tcp://127.0.0.1:*") != 0) return -1;
  char ep[256];
  std::size_t len = sizeof ep;
  zmq_getsockopt(socket, ZMQ_LAST_ENDPOINT, ep, &len);
  const std::string s(ep);
  return std::stoi(s.substr(s.rfind(':') + 1));
}

/// A loopback port free now (a plain socket bound to port 0 and closed at once, which frees it synchronously).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

TEST(KvEventPublisher, BindRuleAndDataParallelOffsetsAreVllms) {
  EXPECT_TRUE(binds_endpoint("tcp://*:5557"));
  EXPECT_TRUE(binds_endpoint("tcp://[::]:5557"));
  EXPECT_TRUE(binds_endpoint("ipc:///tmp/kv"));
  EXPECT_TRUE(binds_endpoint("inproc://kv"));
  EXPECT_FALSE(binds_endpoint("tcp://10.0.0.3:5557"));
  std::string e = "tcp://*:5557";
  EXPECT_TRUE(offset_endpoint(e, 0));
  EXPECT_EQ(e, "tcp://*:5557");
  EXPECT_TRUE(offset_endpoint(e, 3));
  EXPECT_EQ(e, "tcp://*:5560");
  e = "inproc://kv";
  EXPECT_TRUE(offset_endpoint(e, 2));
  EXPECT_EQ(e, "inproc://kv_dp2");
  e = "ipc:///tmp/kv";
  EXPECT_FALSE(offset_endpoint(e, 1));
  e = "tcp://host:65535";
  EXPECT_FALSE(offset_endpoint(e, 1));
  e = "tcp://host:55x";
  EXPECT_FALSE(offset_endpoint(e, 1));
  e = "";
  EXPECT_TRUE(offset_endpoint(e, 4));
  EXPECT_EQ(e, "");
}

TEST(KvEventPublisher, BadOptionsAreRefused) {
  status st;
  kv_event_publisher_config c;
  c.endpoint = "tcp://127.0.0.1:1";
  c.buffer_steps = 0;
  EXPECT_EQ(kv_event_publisher::create(c, st), nullptr);
  EXPECT_EQ(st.code(), errc::invalid_argument);
  c.buffer_steps = 4;
  c.hwm = -1;
  EXPECT_EQ(kv_event_publisher::create(c, st), nullptr);
  EXPECT_EQ(st.code(), errc::invalid_argument);
  c.hwm = 10;
  c.endpoint = "nonsense://x";
  EXPECT_EQ(kv_event_publisher::create(c, st), nullptr);
  EXPECT_EQ(st.code(), errc::invalid_argument);
  c.endpoint = "ipc:///tmp/kvpager_publisher_test";
  c.data_parallel_rank = 1;  // vLLM offsets only tcp and inproc endpoints
  EXPECT_EQ(kv_event_publisher::create(c, st), nullptr);
  EXPECT_EQ(st.code(), errc::invalid_argument);
}

TEST(KvEventPublisher, FramesAndReplayAreVllms) {
  void* ctx = zmq_ctx_new();
  void* sub = zmq_socket(ctx, ZMQ_SUB);
  const int linger = 0;
  zmq_setsockopt(sub, ZMQ_LINGER, &linger, sizeof linger);
  zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "kv", 2);
  const int port = bound_port(sub);
  ASSERT_GT(port, 0);
  const int replay_port = free_port();
  ASSERT_GT(replay_port, 0);

  kv_event_publisher_config c;
  c.endpoint = "tcp://127.0.0.1:" + std::to_string(port);  // connects (no * or ::)
  c.replay_endpoint = "tcp://127.0.0.1:" + std::to_string(replay_port);
  c.topic = "kv";
  c.buffer_steps = 3;
  c.data_parallel_rank = 0;
  status st;
  auto pub = kv_event_publisher::create(c, st);
  ASSERT_NE(pub, nullptr) << st.message();

  kv_event_buffer buf;
  const std::vector<token_id> t{1, 2};
  std::vector<std::string> sent;
  std::vector<std::vector<std::string>> got;
  for (std::uint64_t i = 0; i < 5; ++i) {  // until the subscription has arrived, batches are dropped: replay fills
    buf.clear();
    buf.block_stored(kv_medium::device, 0, 100 + i, false, 0, t);
    ASSERT_TRUE(pub->publish(buf, 1.0 + static_cast<double>(i)));
    std::string p;
    encode_kv_event_batch(buf, 1.0 + static_cast<double>(i), p, 0);
    sent.push_back(p);
    for (auto f = recv_all(sub, 200); !f.empty(); f = recv_all(sub, 50)) got.push_back(f);
  }
  EXPECT_FALSE(got.empty()) << "no batch arrived live (each publish waited 200 ms for the subscription)";
  EXPECT_EQ(pub->batches(), 5u);
  EXPECT_EQ(pub->events(), 5u);
  for (const auto& f : got) {
    ASSERT_EQ(f.size(), 3u);
    EXPECT_EQ(f[0], "kv");
    ASSERT_EQ(f[1].size(), 8u);
    const std::uint64_t seq = detail::get_be64(f[1]);
    ASSERT_LT(seq, 5u);
    EXPECT_EQ(f[2], sent[seq]) << "batch " << seq;  // the payload, its rank 0 included
  }

  // Replay from 0: only the last buffer_steps = 3 are kept (2, 3, 4), then the end marker.
  void* req = zmq_socket(ctx, ZMQ_DEALER);
  zmq_setsockopt(req, ZMQ_LINGER, &linger, sizeof linger);
  ASSERT_EQ(zmq_connect(req, c.replay_endpoint.c_str()), 0);
  std::uint8_t start[8];
  detail::put_be64(0, start);
  zmq_send(req, "", 0, ZMQ_SNDMORE);
  zmq_send(req, start, 8, 0);
  std::vector<std::uint64_t> replayed;
  bool ended = false;
  for (int i = 0; i < 10 && !ended; ++i) {
    const auto f = recv_all(req, 3000);
    ASSERT_EQ(f.size(), 3u);
    EXPECT_TRUE(f[0].empty());
    if (f[1] == std::string(8, '\xff')) {
      EXPECT_TRUE(f[2].empty());
      ended = true;
      break;
    }
    const std::uint64_t seq = detail::get_be64(f[1]);
    replayed.push_back(seq);
    EXPECT_EQ(f[2], sent[seq]);
  }
  EXPECT_TRUE(ended);
  EXPECT_EQ(replayed, (std::vector<std::uint64_t>{2, 3, 4}));
  // A request of another shape is ignored (no answer), as vLLM's.
  zmq_send(req, "", 0, ZMQ_SNDMORE);
  zmq_send(req, "abc", 3, 0);
  EXPECT_TRUE(recv_all(req, 300).empty());
  zmq_close(req);
  pub.reset();
  zmq_close(sub);
  zmq_ctx_term(ctx);
}

}  // namespace
