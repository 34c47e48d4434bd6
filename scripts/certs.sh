#!/usr/bin/env bash
# certs.sh DIR — make the test certificates of the TLS-enabled stores.
#
# Writes into DIR (created if missing), with the openssl CLI:
#   ca.pem ca-key.pem              the test CA (EC P-256, 10 days)
#   server.pem server-key.pem      server certificate for 127.0.0.1, ::1 and
#                                  localhost, signed by the CA
#   server-bundle.pem              server key + certificate in one file
#                                  (ZooKeeper's PEM key store)
#   client.pem client-key.pem      client certificate (CN quorumlock-test),
#                                  signed by the CA
#   other-ca.pem                   an unrelated CA: "the wrong CA" in tests
#
# Idempotent: an existing complete set is kept (DIR/.complete). Keys are
# PKCS#8, which every client here reads (rustls, Java, Go, OpenSSL).
set -euo pipefail

dir=${1:?usage: certs.sh DIR}
[ -f "$dir/.complete" ] && exit 0
command -v openssl >/dev/null || { echo "certs.sh: openssl not found" >&2; exit 1; }
mkdir -p "$dir"
cd "$dir"
rm -f ./*.pem ./*.srl ./*.csr ./*.ext

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

key ca-key.pem
openssl req -x509 -new -key ca-key.pem -sha256 -days 10 -subj "/CN=quorumlock test CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -out ca.pem 2>/dev/null

key other-ca-key.pem
openssl req -x509 -new -key other-ca-key.pem -sha256 -days 10 -subj "/CN=some other CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -out other-ca.pem 2>/dev/null
rm -f other-ca-key.pem

# sign NAME CN EXTENDED_KEY_USAGE [SAN]
sign() {
  local name=$1 cn=$2 eku=$3 san=${4:-}
  key "$name-key.pem"
  openssl req -new -key "$name-key.pem" -subj "/CN=$cn" -out "$name.csr" 2>/dev/null
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$eku"
    [ -n "$san" ] && echo "subjectAltName=$san"
  } >"$name.ext"
  openssl x509 -req -in "$name.csr" -CA ca.pem -CAkey ca-key.pem -CAcreateserial \
    -days 10 -sha256 -extfile "$name.ext" -out "$name.pem" 2>/dev/null
  rm -f "$name.csr" "$name.ext"
}

# Servers also act as clients of each other (etcd peers), hence both usages.
sign server quorumlock-test-server serverAuth,clientAuth "IP:127.0.0.1,IP:::1,DNS:localhost"
sign client quorumlock-test clientAuth
cat server-key.pem server.pem >server-bundle.pem
rm -f ca.srl
chmod 600 ./*-key.pem server-bundle.pem
touch .complete
