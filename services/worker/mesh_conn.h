// One connection of the replicas' mesh (replica_mesh.h): a nonblocking TCP socket, in the
// clear or under TLS (OpenSSL) with the cluster's own credentials.
//
// Under TLS the connecting replica checks that the accepting one's certificate chains to
// --tls_ca and names the host it published (as gRPC checks a worker's certificate against
// the address it dials); with --mtls the accepting replica demands a certificate that chains
// to --tls_ca, so a peer without one fails the handshake and nothing it sends is read as a
// hello or a gradient. The mesh's hello with its secrets then runs inside TLS, as before.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"

struct ssl_st;
struct ssl_ctx_st;

namespace localpar::mesh {

// The cluster's credentials, as PEM text (SecurityOptions).
struct TlsCredentials {
  std::string cert_pem;
  std::string key_pem;
  std::string ca_pem;  // empty: the system's roots
  bool mutual = false;
};

// TLS 1.3 contexts for both ends of a connection, made once per mesh.
class Tls {
 public:
  // An error names what does not load (the certificate, its key, the CA bundle).
  static absl::StatusOr<std::shared_ptr<const Tls>> Make(const TlsCredentials& c);
  ~Tls();
  Tls(const Tls&) = delete;
  Tls& operator=(const Tls&) = delete;

 private:
  friend class Conn;
  Tls() = default;
  ssl_ctx_st* accepting_ = nullptr;
  ssl_ctx_st* connecting_ = nullptr;
};

// How an operation that moved no byte ended.
enum class Io { kDone, kWantRead, kWantWrite, kClosed, kFailed };

// Poll events an operation that ended with `io` waits for (POLLIN or POLLOUT; 0 otherwise).
short EventsFor(Io io);

class Conn {
 public:
  Conn() = default;
  // Takes `fd` (nonblocking). Without tls the connection is ready at once; with it, this
  // end accepts or connects, and a connecting end checks the peer's certificate for `host`.
  Conn(int fd, const Tls* tls, bool accepting, const std::string& host);
  Conn(Conn&& o) noexcept;
  Conn& operator=(Conn&& o) noexcept;
  ~Conn();

  bool open() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  bool tls() const { return ssl_ != nullptr; }

  // Moves the handshake on: kDone once it is complete (at once in the clear).
  Io Handshake();
  // Like send and recv on a nonblocking socket: the bytes moved (> 0), or 0 and *io says
  // why none moved (kClosed: the peer ended the connection).
  size_t Send(const char* data, size_t bytes, Io* io);
  size_t Recv(char* data, size_t bytes, Io* io);
  // Bytes read from the socket already and waiting in OpenSSL's buffer, which poll cannot
  // see; false once a read found only part of a record there (then poll must wait for more).
  bool Pending() const;
  // Why the last operation failed (kFailed), and its errno where the socket failed (else 0).
  const std::string& error() const { return error_; }
  int error_number() const { return errno_; }

  void Close();

 private:
  Io Failed(int ssl_result);

  int fd_ = -1;
  ssl_st* ssl_ = nullptr;
  std::string error_;
  int errno_ = 0;
  bool starved_ = false;  // the last read or handshake step wanted more from the socket
};

}  // namespace localpar::mesh
