// TLS for every native program: the credentials of its channels and its listening port.
//
// One setting per process, as in pytest_tfgrpc/wire/security.py, read from the environment
// variables a parent hands its children (security.ENV_VARS):
//
//   TFGRPC_TLS_CERT + TFGRPC_TLS_KEY  servers serve TLS with them; clients present them
//   TFGRPC_TLS_CA                     clients verify servers against it; servers with a CA
//                                     require and verify client certificates (mutual TLS)
//
// None set: plaintext (the default). The checks and their messages are load_tls()'s: a file
// that cannot be read or is not PEM, a certificate without its key or the other way round.
//
// TLS 1.3 suites: TLS_AES_128_GCM_SHA256 first, the order gRPC's own default list gives (see
// prefer_aes_128_gcm below), unless the system's OpenSSL configuration sets a TLS policy.
//
// Use (one call each, at start-up; TlsError carries a one-line message naming the variable):
//   tfgrpc::Tls tls = tfgrpc::Tls::from_env();
//   builder.AddListeningPort(address, tls.server_credentials(), &port);
//   grpc::CreateCustomChannel(target, tls.channel_credentials(), args);
//   tls.mode()  // "off", "tls" or "mtls", as security.tls_mode() (for ready lines, records)
#pragma once

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <openssl/bio.h>
#include <openssl/conf.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>

namespace tfgrpc {

class TlsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// gRPC 1.51 lists TLS_AES_128_GCM_SHA256 first in its default ciphers but hands that list only
// to SSL_CTX_set_cipher_list, which covers TLS 1.2 and below; TLS 1.3 then takes OpenSSL's own
// order, AES-256-GCM first. AES-128-GCM is TLS 1.3's mandatory suite (RFC 8446, 9.1) and costs
// less CPU per byte, which bounds a TLS connection here (docs/tasks/native-engine.md). So,
// once per process before gRPC makes a TLS context, this loads an OpenSSL configuration whose
// system_default (applied by SSL_CTX_new to every context) orders the TLS 1.3 suites
// AES-128-GCM, AES-256-GCM, ChaCha20-Poly1305 with the server's order deciding. A system whose
// OpenSSL configuration sets an ssl_conf policy (crypto-policies, a hardened openssl.cnf) keeps
// it: then nothing is loaded. Returns whether the order was loaded.
inline bool prefer_aes_128_gcm() {
  static const bool loaded = [] {
    OPENSSL_init_ssl(OPENSSL_INIT_LOAD_CONFIG, nullptr);  // the system's configuration, once
    bool policy = false;
    if (char* path = CONF_get1_default_config_file()) {
      CONF* system = NCONF_new(nullptr);
      long line = 0;
      if (system != nullptr && NCONF_load(system, path, &line) > 0) {
        const char* init = NCONF_get_string(system, nullptr, "openssl_conf");
        policy = init != nullptr && NCONF_get_string(system, init, "ssl_conf") != nullptr;
      }
      NCONF_free(system);
      OPENSSL_free(path);
    }
    static const char kOrder[] =
        "tfgrpc_conf = tfgrpc_init\n"
        "[tfgrpc_init]\nssl_conf = tfgrpc_ssl\n"
        "[tfgrpc_ssl]\nsystem_default = tfgrpc_tls\n"
        "[tfgrpc_tls]\nCiphersuites = "
        "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256\n"
        "Options = ServerPreference\n";
    bool ok = false;
    if (!policy) {
      BIO* text = BIO_new_mem_buf(kOrder, -1);
      CONF* order = NCONF_new(nullptr);
      long line = 0;
      ok = text != nullptr && order != nullptr && NCONF_load_bio(order, text, &line) > 0 &&
           CONF_modules_load(order, "tfgrpc_conf", 0) > 0;
      NCONF_free(order);
      BIO_free(text);
    }
    ERR_clear_error();  // a missing entry queues an error gRPC must not find later
    return ok;
  }();
  return loaded;
}

class Tls {
 public:
  // The setting the parent handed this process; TlsError if it cannot work.
  static Tls from_env() {
    Tls tls;
    tls.cert_ = read("TFGRPC_TLS_CERT");
    tls.key_ = read("TFGRPC_TLS_KEY");
    tls.ca_ = read("TFGRPC_TLS_CA");
    if (tls.cert_.empty() != tls.key_.empty()) {
      bool cert = !tls.cert_.empty();
      throw TlsError(std::string("$TFGRPC_TLS_") + (cert ? "CERT" : "KEY") + " needs $TFGRPC_TLS_" +
                     (cert ? "KEY" : "CERT") + " too");
    }
    return tls;
  }

  bool enabled() const { return !cert_.empty() || !ca_.empty(); }
  bool mutual() const { return !cert_.empty() && !ca_.empty(); }
  const char* mode() const { return !enabled() ? "off" : mutual() ? "mtls" : "tls"; }

  std::shared_ptr<grpc::ChannelCredentials> channel_credentials() const {
    if (!enabled()) return grpc::InsecureChannelCredentials();
    prefer_aes_128_gcm();
    grpc::SslCredentialsOptions options;
    options.pem_root_certs = ca_;  // empty: the system's roots, as grpc.ssl_channel_credentials
    options.pem_private_key = key_;
    options.pem_cert_chain = cert_;
    return grpc::SslCredentials(options);
  }

  // TlsError for a CA alone: a server needs its own certificate to serve TLS.
  std::shared_ptr<grpc::ServerCredentials> server_credentials() const {
    if (!enabled()) return grpc::InsecureServerCredentials();
    if (cert_.empty()) {
      throw TlsError(
          "a TLS server needs a certificate and its key ($TFGRPC_TLS_CERT, $TFGRPC_TLS_KEY); "
          "only $TFGRPC_TLS_CA is set");
    }
    prefer_aes_128_gcm();
    grpc::SslServerCredentialsOptions options(
        ca_.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                    : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    options.pem_root_certs = ca_;
    options.pem_key_cert_pairs.push_back({key_, cert_});
    return grpc::SslServerCredentials(options);
  }

 private:
  static std::string read(const char* variable) {
    const char* path = std::getenv(variable);
    if (path == nullptr || *path == '\0') return "";
    std::ifstream file(path, std::ios::binary);
    if (!file) throw TlsError(std::string("$") + variable + " " + path + ": cannot be read");
    std::ostringstream data;
    data << file.rdbuf();
    std::string pem = data.str();
    if (pem.find("-----BEGIN ") == std::string::npos) {
      throw TlsError(std::string("$") + variable + " " + path +
                     ": not a PEM file (no '-----BEGIN' line)");
    }
    return pem;
  }

  std::string cert_, key_, ca_;
};

}  // namespace tfgrpc
