// One connection of the replicas' mesh, in the clear or under TLS (mesh_conn.h).
#include "services/worker/mesh_conn.h"

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <ctime>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/worker/mesh_wire.h"

namespace localpar::mesh {
namespace {

// OpenSSL writes to the socket with write(), which raises SIGPIPE when the peer has gone;
// the plain mesh sends with MSG_NOSIGNAL. While a TLS call runs, this thread blocks SIGPIPE
// and takes back one that the call raised, so a vanished peer is an error, never a signal.
class QuietPipe {
 public:
  QuietPipe() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~QuietPipe() {
    sigset_t pending;
    sigpending(&pending);
    if (!was_pending_ && sigismember(&pending, SIGPIPE) == 1) {
      timespec none{};
      sigtimedwait(&pipe_, nullptr, &none);
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }

 private:
  sigset_t pipe_, old_;
  bool was_pending_ = false;
};

// The first error on this thread's OpenSSL queue, as text.
std::string TlsError() {
  const unsigned long e = ERR_get_error();
  if (e == 0) return "TLS failed";
  char text[256];
  ERR_error_string_n(e, text, sizeof(text));
  ERR_clear_error();
  return text;
}

// Every certificate in `pem`, or an error naming `what`.
absl::StatusOr<std::vector<X509*>> Certificates(const std::string& pem, const char* what) {
  std::vector<X509*> out;
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  while (X509* x = bio ? PEM_read_bio_X509(bio, nullptr, nullptr, nullptr) : nullptr) {
    out.push_back(x);
  }
  ERR_clear_error();  // the end of the text reads as an error
  BIO_free(bio);
  if (out.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": no certificate the replica exchange can load"));
  }
  return out;
}

absl::Status Load(SSL_CTX* ctx, const TlsCredentials& c, bool verify_peer) {
  SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  // A peer that closes without close_notify reads as closed, as in the clear: frames carry
  // their length, so nothing is cut short unnoticed.
  SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
  SSL_CTX_set_num_tickets(ctx, 0);  // one connection per pair, never resumed
  // Read what the socket holds, not a record header then its body: two system calls per
  // 16 KiB record fewer (SSL_has_pending then covers the bytes read ahead).
  SSL_CTX_set_read_ahead(ctx, 1);
  SSL_CTX_set_default_read_buffer_len(ctx, 1 << 17);
  if (!c.cert_pem.empty()) {
    absl::StatusOr<std::vector<X509*>> chain = Certificates(c.cert_pem, "--tls_cert");
    if (!chain.ok()) return chain.status();
    bool ok = SSL_CTX_use_certificate(ctx, (*chain)[0]) == 1;
    X509_free((*chain)[0]);
    for (size_t i = 1; i < chain->size(); ++i) {
      // The context takes the intermediate certificates it is given.
      if (ok) ok = SSL_CTX_add_extra_chain_cert(ctx, (*chain)[i]) == 1;
      if (!ok) X509_free((*chain)[i]);
    }
    BIO* bio = BIO_new_mem_buf(c.key_pem.data(), static_cast<int>(c.key_pem.size()));
    EVP_PKEY* key = bio ? PEM_read_bio_PrivateKey(bio, nullptr, nullptr, nullptr) : nullptr;
    BIO_free(bio);
    ok = ok && key != nullptr && SSL_CTX_use_PrivateKey(ctx, key) == 1 &&
         SSL_CTX_check_private_key(ctx) == 1;
    EVP_PKEY_free(key);
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tls_cert and --tls_key do not load as a certificate and its key: ", TlsError()));
    }
  }
  if (c.ca_pem.empty()) {
    SSL_CTX_set_default_verify_paths(ctx);
  } else {
    absl::StatusOr<std::vector<X509*>> cas = Certificates(c.ca_pem, "--tls_ca");
    if (!cas.ok()) return cas.status();
    X509_STORE* store = SSL_CTX_get_cert_store(ctx);
    for (X509* x : *cas) {
      X509_STORE_add_cert(store, x);
      X509_free(x);
    }
    ERR_clear_error();  // a certificate listed twice is not an error
  }
  SSL_CTX_set_verify(
      ctx, verify_peer ? SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT : SSL_VERIFY_NONE,
      nullptr);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<const Tls>> Tls::Make(const TlsCredentials& c) {
  if (c.cert_pem.empty() || c.key_pem.empty()) {
    return absl::FailedPreconditionError(
        "the replicas of a TLS cluster exchange under TLS, and each needs --tls_cert and "
        "--tls_key for it");
  }
  std::shared_ptr<Tls> tls(new Tls());
  tls->accepting_ = SSL_CTX_new(TLS_server_method());
  tls->connecting_ = SSL_CTX_new(TLS_client_method());
  if (!tls->accepting_ || !tls->connecting_) {
    return absl::InternalError(absl::StrCat("cannot make a TLS context: ", TlsError()));
  }
  if (absl::Status s = Load(tls->accepting_, c, c.mutual); !s.ok()) return s;
  if (absl::Status s = Load(tls->connecting_, c, true); !s.ok()) return s;
  return std::shared_ptr<const Tls>(std::move(tls));
}

Tls::~Tls() {
  SSL_CTX_free(accepting_);
  SSL_CTX_free(connecting_);
}

short EventsFor(Io io) {
  if (io == Io::kWantRead) return POLLIN;
  if (io == Io::kWantWrite) return POLLOUT;
  return 0;
}

Conn::Conn(int fd, const Tls* tls, bool accepting, const std::string& host) : fd_(fd) {
  if (tls == nullptr || fd < 0) return;
  ssl_ = SSL_new(accepting ? tls->accepting_ : tls->connecting_);
  if (ssl_ == nullptr || SSL_set_fd(ssl_, fd) != 1) {
    error_ = absl::StrCat("cannot start TLS: ", TlsError());
    return;
  }
  if (accepting) {
    SSL_set_accept_state(ssl_);
    return;
  }
  SSL_set_connect_state(ssl_);
  // The accepting replica's certificate must name the host it published.
  in6_addr ip;
  const bool is_ip =
      inet_pton(AF_INET, host.c_str(), &ip) == 1 || inet_pton(AF_INET6, host.c_str(), &ip) == 1;
  const int named = is_ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl_), host.c_str())
                          : SSL_set1_host(ssl_, host.c_str());
  if (!is_ip) SSL_set_tlsext_host_name(ssl_, host.c_str());
  if (named != 1) error_ = absl::StrCat("cannot check certificates for '", host, "'");
}

Conn::Conn(Conn&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)),
      ssl_(std::exchange(o.ssl_, nullptr)),
      error_(std::move(o.error_)),
      errno_(o.errno_),
      starved_(o.starved_) {}

Conn& Conn::operator=(Conn&& o) noexcept {
  if (this != &o) {
    Close();
    fd_ = std::exchange(o.fd_, -1);
    ssl_ = std::exchange(o.ssl_, nullptr);
    error_ = std::move(o.error_);
    errno_ = o.errno_;
    starved_ = o.starved_;
  }
  return *this;
}

Conn::~Conn() { Close(); }

void Conn::Close() {
  if (ssl_ != nullptr) SSL_free(ssl_);  // no close_notify: the socket closes at once
  ssl_ = nullptr;
  CloseFd(fd_);
}

Io Conn::Failed(int ssl_result) {
  switch (ssl_result) {
    case SSL_ERROR_WANT_READ:
      return Io::kWantRead;
    case SSL_ERROR_WANT_WRITE:
      return Io::kWantWrite;
    case SSL_ERROR_ZERO_RETURN:
      return Io::kClosed;
    case SSL_ERROR_SYSCALL:
      errno_ = errno;
      if (errno_ == 0) return Io::kClosed;
      error_ = Errno(errno_);
      return Io::kFailed;
    default: {
      error_ = TlsError();
      const long verify = SSL_get_verify_result(ssl_);
      if (verify != X509_V_OK) {
        error_ = absl::StrCat(error_, " (", X509_verify_cert_error_string(verify), ")");
      }
      return Io::kFailed;
    }
  }
}

Io Conn::Handshake() {
  if (ssl_ == nullptr) {
    if (error_.empty()) return Io::kDone;
    return Io::kFailed;  // TLS could not start
  }
  if (SSL_is_init_finished(ssl_)) return Io::kDone;
  if (!error_.empty()) return Io::kFailed;
  QuietPipe quiet;
  ERR_clear_error();
  const int r = SSL_do_handshake(ssl_);
  const Io io = r == 1 ? Io::kDone : Failed(SSL_get_error(ssl_, r));
  starved_ = io == Io::kWantRead;
  return io;
}

size_t Conn::Send(const char* data, size_t bytes, Io* io) {
  *io = Io::kDone;
  if (bytes == 0) return 0;
  const int n = static_cast<int>(std::min<size_t>(bytes, INT_MAX));
  if (ssl_ != nullptr) {
    QuietPipe quiet;
    ERR_clear_error();
    const int r = SSL_write(ssl_, data, n);
    if (r > 0) return static_cast<size_t>(r);
    *io = Failed(SSL_get_error(ssl_, r));
    return 0;
  }
  const ssize_t k = send(fd_, data, static_cast<size_t>(n), MSG_NOSIGNAL);
  if (k > 0) return static_cast<size_t>(k);
  if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
    errno_ = errno;
    error_ = Errno(errno_);
    *io = Io::kFailed;
  } else {
    *io = Io::kWantWrite;
  }
  return 0;
}

size_t Conn::Recv(char* data, size_t bytes, Io* io) {
  *io = Io::kDone;
  if (bytes == 0) return 0;
  const int n = static_cast<int>(std::min<size_t>(bytes, INT_MAX));
  if (ssl_ != nullptr) {
    QuietPipe quiet;
    ERR_clear_error();
    const int r = SSL_read(ssl_, data, n);
    starved_ = false;
    if (r > 0) return static_cast<size_t>(r);
    *io = Failed(SSL_get_error(ssl_, r));
    starved_ = *io == Io::kWantRead;
    return 0;
  }
  const ssize_t k = recv(fd_, data, static_cast<size_t>(n), 0);
  if (k > 0) return static_cast<size_t>(k);
  if (k == 0) {
    *io = Io::kClosed;
  } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
    *io = Io::kWantRead;
  } else {
    errno_ = errno;
    error_ = Errno(errno_);
    *io = Io::kFailed;
  }
  return 0;
}

bool Conn::Pending() const {
  // With read-ahead a buffer can hold part of a record: reading it again before the socket
  // has more would only spin.
  return ssl_ != nullptr && !starved_ && SSL_has_pending(ssl_) == 1;
}

}  // namespace localpar::mesh
