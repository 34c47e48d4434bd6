#!/usr/bin/env bash
# stores.sh — install and run real ZooKeeper, etcd (3.4 and 3.5), Consul, Redis
# and PostgreSQL servers on loopback, as plain processes (no docker), for quorumlock's tests.
#
#   scripts/stores.sh install [STORE...]   install what is missing, start nothing
#   scripts/stores.sh up      [STORE...]   install, start (idempotent), print env
#   scripts/stores.sh down    [STORE...]   stop what `up` started, remove state
#   scripts/stores.sh status  [STORE...]   one line per store; exit 3 if any is down
#   scripts/stores.sh env     [STORE...]   print the export lines, start nothing
#
# STORE is any of: zk etcd etcd35 consul redis zk-tls etcd-tls consul-tls
# redis-tls postgres (default: all ten).
#
#   eval "$(scripts/stores.sh up)"        # progress goes to stderr
#
# Stores (all on 127.0.0.1):
#   zk      ZooKeeper 3.8 (bookworm) standalone   client 2181, tickTime 200 ms
#   etcd    etcd 3.4 (bookworm)                   client 2379, peer 2380
#   etcd35  etcd 3.5 (trixie .deb, unpacked)      client 2479, peer 2480
#   consul  Consul 1.8.7 (bullseye .deb, unpacked) `agent -dev`: HTTP 8500,
#           server RPC 8300, serf 8301/8302, gRPC 8502, DNS 8600
#   redis   Redis 7.0 (bookworm) standalone        6379, no persistence
#           (the failover test starts its own pair with QUORUMLOCK_REDIS_SERVER)
#   postgres PostgreSQL 15 (bookworm)            5432, database quorumlock, user
#           postgres without a password (trust on loopback), fsync off; run as
#           the Debian package's `postgres` user (it refuses to run as root);
#           TLS on the same port (scripts/certs.sh's certificates): the user
#           quorumlock-test, the client certificate's CN, logs in only over
#           TLS with that certificate (pg_hba `cert`);
#           pgbouncer (bookworm) installed, not started: the pooler test
#           starts its own, and the failover test its own primary + standby
#   The same servers with TLS, every one requiring a client certificate
#   (mutual TLS), certificates made by scripts/certs.sh into $STATE/certs:
#   zk-tls     ZooKeeper, Netty, secureClientPort 2281 (plain 2182: probes only)
#   etcd-tls   etcd 3.4                          client 2389, peer 2390 (http)
#   consul-tls Consul `agent -dev`: HTTPS 8501 (verify_incoming_https), HTTP
#              18500 (probes only), server RPC 18300, serf 18301/18302
#   redis-tls  Redis, tls-port 6380 (no plain port), tls-auth-clients yes
#
# Environment:
#   QUORUMLOCK_CACHE   downloaded/unpacked packages (default ~/.cache/quorumlock)
#   QUORUMLOCK_STATE   data dirs, pid files, logs (default /tmp/quorumlock-stores)
#                      logs: $QUORUMLOCK_STATE/<store>/log
#   QUORUMLOCK_STORES_TIMEOUT  seconds to wait for each store (default 60)
#   QUORUMLOCK_ZK_TICK_MS      ZooKeeper tickTime (default 200; sessions are
#                              clamped to 2..20 ticks by the server; the
#                              ZooKeeper backend refuses a timeout under 5)
#
# Needs root (apt-get, dpkg-deb) only when something is missing. Traffic goes
# to the machine's configured Debian mirror (install) and to loopback.
set -euo pipefail

CACHE=${QUORUMLOCK_CACHE:-$HOME/.cache/quorumlock}
STATE=${QUORUMLOCK_STATE:-/tmp/quorumlock-stores}
TIMEOUT=${QUORUMLOCK_STORES_TIMEOUT:-60}
ZK_TICK_MS=${QUORUMLOCK_ZK_TICK_MS:-200}

HOST=127.0.0.1
ZK_PORT=2181
ETCD_PORT=2379
ETCD_PEER_PORT=2380
ETCD35_PORT=2479
ETCD35_PEER_PORT=2480
CONSUL_HTTP_PORT=8500
# Every port `consul agent -dev -client 127.0.0.1` opens (TCP side).
CONSUL_PORTS=(8500 8300 8301 8302 8502 8600)
REDIS_PORT=6379
ZK_TLS_PORT=2281
ZK_TLS_PLAIN_PORT=2182
ETCD_TLS_PORT=2389
ETCD_TLS_PEER_PORT=2390
CONSUL_TLS_HTTPS_PORT=8501
CONSUL_TLS_PORTS=(8501 18500 18300 18301 18302)
REDIS_TLS_PORT=6380
POSTGRES_PORT=5432
CERTS=$STATE/certs

ALL_STORES=(zk etcd etcd35 consul redis zk-tls etcd-tls consul-tls redis-tls postgres)

# Debian packages from the machine's own suite (bookworm).
# openssl makes the TLS stores' certificates (scripts/certs.sh); the TLS
# ZooKeeper runs Netty's connection factory (libnetty-java). pgbouncer: the
# PostgreSQL tests start their own (tests/pooler.rs, as the postgres user);
# the package's service is never started (policy-rc.d below).
APT_PACKAGES=(zookeeper etcd-server etcd-client protobuf-compiler libprotobuf-dev libcurator-recipes-java redis-server openssl libnetty-java postgresql-15 pgbouncer)
# The Curator interop test compiles its Java peer: a JDK, unless one is there
# (zookeeper pulls in only a JRE).
command -v javac >/dev/null || APT_PACKAGES+=(default-jdk-headless)

# Binaries unpacked from other suites (see fetch_foreign).
TRIXIE_DIR=$CACHE/apt-trixie
BULLSEYE_DIR=$CACHE/apt-bullseye
ETCD35_BIN=$TRIXIE_DIR/root/usr/bin/etcd
ETCDCTL35_BIN=$TRIXIE_DIR/root/usr/bin/etcdctl
CONSUL_BIN=$BULLSEYE_DIR/root/usr/bin/consul
ETCD_BIN=/usr/bin/etcd
ETCDCTL_BIN=/usr/bin/etcdctl
ZK_JAR=/usr/share/java/zookeeper.jar
REDIS_BIN=/usr/bin/redis-server
REDIS_CLI=/usr/bin/redis-cli
PG_BIN_DIR=/usr/lib/postgresql/15/bin
PSQL=/usr/bin/psql
PGBOUNCER_BIN=/usr/sbin/pgbouncer
JAVA_DIR=/usr/share/java

log() { printf 'stores.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
  exit "${1:-2}"
}

# ---------------------------------------------------------------- install ---

pkg_installed() {
  [ "$(dpkg-query -W -f='${db:Status-Abbrev}' "$1" 2>/dev/null || true)" = "ii " ]
}

apt_lists_present() {
  compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null
}

# Keep package maintainer scripts from starting system services (etcd-server
# ships an init script that would grab 127.0.0.1:2379). Only when the machine
# has no policy of its own; removed again on exit.
POLICY_RC=/usr/sbin/policy-rc.d
POLICY_RC_OURS=0
deny_service_starts() {
  if [ ! -e "$POLICY_RC" ]; then
    printf '#!/bin/sh\n# temporary, written by quorumlock scripts/stores.sh\nexit 101\n' >"$POLICY_RC"
    chmod 755 "$POLICY_RC"
    POLICY_RC_OURS=1
  fi
}
restore_service_starts() {
  if [ "$POLICY_RC_OURS" = 1 ]; then rm -f "$POLICY_RC"; POLICY_RC_OURS=0; fi
}

install_apt_packages() {
  local missing=() p
  for p in "${APT_PACKAGES[@]}"; do
    pkg_installed "$p" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  [ "$(id -u)" = 0 ] || die "missing packages (${missing[*]}) and not root"
  local apt=(apt-get -q -y -o DPkg::Lock::Timeout=300 --no-install-recommends)
  local need_update=0 cand
  if ! apt_lists_present; then
    need_update=1
  else
    for p in "${missing[@]}"; do
      cand=$(apt-cache policy "$p" 2>/dev/null | awk '/Candidate:/{print $2}')
      if [ -z "$cand" ] || [ "$cand" = "(none)" ]; then need_update=1; break; fi
    done
  fi
  if [ "$need_update" = 1 ]; then
    log "apt-get update"
    apt-get -q -o DPkg::Lock::Timeout=300 update >&2
  fi
  log "apt-get install ${missing[*]}"
  deny_service_starts
  trap restore_service_starts EXIT
  if ! DEBIAN_FRONTEND=noninteractive "${apt[@]}" install "${missing[@]}" >&2; then
    log "install failed; retrying after apt-get update"
    apt-get -q -o DPkg::Lock::Timeout=300 update >&2
    DEBIAN_FRONTEND=noninteractive "${apt[@]}" install "${missing[@]}" >&2
  fi
  restore_service_starts
  trap - EXIT
}

mirror_uri() {
  local uri=""
  if [ -r /etc/apt/sources.list.d/debian.sources ]; then
    uri=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources)
  fi
  if [ -z "$uri" ] && [ -r /etc/apt/sources.list ]; then
    uri=$(awk '$1=="deb" && $0 !~ /security/ {for(i=2;i<=NF;i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' /etc/apt/sources.list)
  fi
  [ -n "$uri" ] || die "cannot find the Debian mirror URI in /etc/apt"
  printf '%s\n' "$uri"
}

# fetch_foreign SUITE PACKAGE... : download PACKAGEs from another Debian suite
# with a private apt state (the system's sources and lists stay untouched),
# unpack them into $CACHE/apt-SUITE/root. Optional packages end with '?'.
fetch_foreign() {
  local suite=$1; shift
  local d=$CACHE/apt-$suite
  [ -f "$d/root/.complete" ] && return 0
  log "fetching $* from Debian $suite into $d"
  rm -rf "$d/root" "$d/debs"
  mkdir -p "$d/lists/partial" "$d/cache/archives/partial" "$d/debs"
  local keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  local signed=""
  [ -r "$keyring" ] && signed="[signed-by=$keyring] "
  printf 'deb %s%s %s main\n' "$signed" "$(mirror_uri)" "$suite" >"$d/sources.list"
  local o=(-o "Dir::Etc::sourcelist=$d/sources.list" -o Dir::Etc::sourceparts=/dev/null
           -o "Dir::State::Lists=$d/lists" -o "Dir::Cache=$d/cache"
           -o Acquire::Languages=none -o APT::Sandbox::User=root -q
           -o Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false
           -o Acquire::IndexTargets::deb::DEP-11-icons-small::DefaultEnabled=false)
  apt-get "${o[@]}" update >&2
  local p want=()
  for p in "$@"; do
    case $p in
      *\?) p=${p%\?}
           if apt-cache "${o[@]}" show "$p" >/dev/null 2>&1; then want+=("$p")
           else log "$suite has no package $p; skipped"; fi ;;
      *) want+=("$p") ;;
    esac
  done
  (cd "$d/debs" && apt-get "${o[@]}" download "${want[@]}" >&2)
  local deb
  for deb in "$d"/debs/*.deb; do
    dpkg-deb -x "$deb" "$d/root"
  done
  log "$suite: unpacked $(cd "$d/debs" && echo *.deb)"
  # Only the unpacked tree is used from now on; keep the cache small.
  rm -rf "$d/lists" "$d/cache" "$d/debs"
  touch "$d/root/.complete"
}

install_stores() {
  local s want_trixie=0 want_bullseye=0
  for s in "$@"; do
    case $s in
      etcd35) want_trixie=1 ;;
      consul|consul-tls) want_bullseye=1 ;;
    esac
  done
  mkdir -p "$CACHE"
  # Serialise concurrent installs. The lock fd lives only in this subshell so
  # that no server started later inherits it.
  (
    if command -v flock >/dev/null; then flock 9; fi
    install_apt_packages
    if [ "$want_trixie" = 1 ]; then fetch_foreign trixie etcd-server 'etcd-client?'; fi
    if [ "$want_bullseye" = 1 ]; then fetch_foreign bullseye consul; fi
  ) 9>"$CACHE/.install.lock"
  command -v java >/dev/null || die "java not found (the zookeeper package should have pulled in default-jre)"
  for s in "$@"; do
    case $s in
      zk|zk-tls) [ -r "$ZK_JAR" ] || die "$ZK_JAR missing" ;;
      etcd|etcd-tls) if [ ! -x "$ETCD_BIN" ] || [ ! -x "$ETCDCTL_BIN" ]; then die "$ETCD_BIN or $ETCDCTL_BIN missing"; fi ;;
      etcd35) [ -x "$ETCD35_BIN" ] || die "$ETCD35_BIN missing (rm -rf $TRIXIE_DIR and retry)" ;;
      consul|consul-tls) [ -x "$CONSUL_BIN" ] || die "$CONSUL_BIN missing (rm -rf $BULLSEYE_DIR and retry)" ;;
      redis|redis-tls) if [ ! -x "$REDIS_BIN" ] || [ ! -x "$REDIS_CLI" ]; then die "$REDIS_BIN or $REDIS_CLI missing"; fi ;;
      postgres) if [ ! -x "$PG_BIN_DIR/postgres" ] || [ ! -x "$PSQL" ] || [ ! -x "$PGBOUNCER_BIN" ]; then
                  die "$PG_BIN_DIR/postgres, $PSQL or $PGBOUNCER_BIN missing"; fi
                id -u postgres >/dev/null 2>&1 || die "no user postgres (the postgresql-common package creates it)" ;;
    esac
  done
}

# ------------------------------------------------------------- classpath ---

# Curator + ZooKeeper client classpath from Debian's jars: the closure of the
# manifests' Class-Path entries (followed with python3 or unzip when present),
# plus slf4j-nop so that the client does not warn about a missing binding
# (swap in slf4j-simple.jar to see Curator's logs).
curator_classpath() {
  local roots=(curator-recipes curator-framework curator-client zookeeper zookeeper-jute guava slf4j-api)
  local jars=() j
  for j in "${roots[@]}"; do jars+=("$JAVA_DIR/$j.jar"); done
  local closure=""
  if command -v python3 >/dev/null; then
    closure=$(python3 - "${jars[@]}" <<'EOF' 2>/dev/null || true
import sys, zipfile
seen, todo = [], list(sys.argv[1:])
while todo:
    j = todo.pop(0)
    if j in seen:
        continue
    seen.append(j)
    try:
        m = zipfile.ZipFile(j).read("META-INF/MANIFEST.MF").decode("utf-8", "replace")
    except Exception:
        continue
    m = m.replace("\r", "").replace("\n ", "")
    for line in m.split("\n"):
        if line.startswith("Class-Path:"):
            todo += [p for p in line.split(":", 1)[1].split() if p.startswith("/")]
print("\n".join(seen))
EOF
)
  elif command -v unzip >/dev/null; then
    local seen=() todo=("${jars[@]}") cp
    while [ ${#todo[@]} -gt 0 ]; do
      j=${todo[0]}; todo=("${todo[@]:1}")
      case " ${seen[*]} " in *" $j "*) continue ;; esac
      seen+=("$j")
      cp=$(unzip -p "$j" META-INF/MANIFEST.MF 2>/dev/null | tr -d '\r' |
           sed -e ':a' -e 'N' -e '$!ba' -e 's/\n //g' | sed -n 's/^Class-Path: *//p' || true)
      for p in $cp; do case $p in /*) todo+=("$p") ;; esac; done
    done
    closure=$(printf '%s\n' "${seen[@]}")
  fi
  if [ -z "$closure" ]; then
    closure=$(printf '%s\n' "${jars[@]}")
  fi
  closure+=$'\n'"$JAVA_DIR/slf4j-nop.jar"
  local out=() seen_cp=" "
  while IFS= read -r j; do
    if [ -z "$j" ] || [ ! -e "$j" ]; then continue; fi
    case $seen_cp in *" $j "*) continue ;; esac
    seen_cp+="$j "
    out+=("$j")
  done <<<"$closure"
  local IFS=:
  printf '%s\n' "${out[*]}"
}

# ----------------------------------------------------------------- probes ---

# tcp_open PORT: something accepts TCP connections on 127.0.0.1:PORT.
tcp_open() {
  timeout 2 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$HOST" "$1" 2>/dev/null
}

# zk_4lw WORD [PORT]: a ZooKeeper four-letter-word command, answer on stdout.
zk_4lw() {
  timeout 3 bash -c 'exec 3<>"/dev/tcp/$0/$1" && printf %s "$2" >&3 && cat <&3' \
    "$HOST" "${2:-$ZK_PORT}" "$1" 2>/dev/null || true
}

# http_get PORT PATH: response body on stdout (curl, else bash /dev/tcp).
http_get() {
  if command -v curl >/dev/null; then
    curl -fsS -m 3 "http://$HOST:$1$2" 2>/dev/null || true
  else
    timeout 3 bash -c 'exec 3<>"/dev/tcp/$0/$1" &&
      printf "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n" "$2" "$0" >&3 && cat <&3' \
      "$HOST" "$1" "$2" 2>/dev/null | sed '1,/^\r*$/d' || true
  fi
}

etcd_healthy() { # PORT [etcdctl TLS flags...]
  local port=$1 scheme=http; shift
  [ $# -gt 0 ] && scheme=https
  ETCDCTL_API=3 "$ETCDCTL_BIN" --endpoints="$scheme://$HOST:$port" --dial-timeout=2s \
    --command-timeout=3s "$@" endpoint health >/dev/null 2>&1
}

healthy() { # STORE
  case $1 in
    zk) [ "$(zk_4lw ruok)" = imok ] ;;
    etcd) etcd_healthy "$ETCD_PORT" ;;
    etcd35) etcd_healthy "$ETCD35_PORT" ;;
    consul)
      local leader
      leader=$(http_get "$CONSUL_HTTP_PORT" /v1/status/leader)
      [ -n "$leader" ] && [ "$leader" != '""' ] ;;
    redis) [ "$(timeout 3 "$REDIS_CLI" -h "$HOST" -p "$REDIS_PORT" ping 2>/dev/null)" = PONG ] ;;
    zk-tls) [ "$(zk_4lw ruok "$ZK_TLS_PLAIN_PORT")" = imok ] ;;
    etcd-tls) etcd_healthy "$ETCD_TLS_PORT" --cacert "$CERTS/ca.pem" \
                --cert "$CERTS/client.pem" --key "$CERTS/client-key.pem" ;;
    consul-tls)
      local leader
      leader=$(http_get 18500 /v1/status/leader)
      [ -n "$leader" ] && [ "$leader" != '""' ] ;;
    redis-tls) [ "$(timeout 3 "$REDIS_CLI" -h "$HOST" -p "$REDIS_TLS_PORT" --tls \
                   --cacert "$CERTS/ca.pem" --cert "$CERTS/client.pem" \
                   --key "$CERTS/client-key.pem" ping 2>/dev/null)" = PONG ] ;;
    postgres) [ "$(timeout 3 "$PSQL" -h "$HOST" -p "$POSTGRES_PORT" -U postgres -d quorumlock \
                  -XAtc 'select 1' 2>/dev/null)" = 1 ] ;;
  esac
}

ports_of() { # STORE
  case $1 in
    zk) echo "$ZK_PORT" ;;
    etcd) echo "$ETCD_PORT $ETCD_PEER_PORT" ;;
    etcd35) echo "$ETCD35_PORT $ETCD35_PEER_PORT" ;;
    consul) echo "${CONSUL_PORTS[*]}" ;;
    redis) echo "$REDIS_PORT" ;;
    zk-tls) echo "$ZK_TLS_PORT $ZK_TLS_PLAIN_PORT" ;;
    etcd-tls) echo "$ETCD_TLS_PORT $ETCD_TLS_PEER_PORT" ;;
    consul-tls) echo "${CONSUL_TLS_PORTS[*]}" ;;
    redis-tls) echo "$REDIS_TLS_PORT" ;;
    postgres) echo "$POSTGRES_PORT" ;;
  esac
}

# ------------------------------------------------------------- processes ---

store_dir() { printf '%s/%s\n' "$STATE" "$1"; }

# alive PID: the process exists and is not a zombie (an exited daemon stays a
# zombie until init reaps it, which can take seconds in a container).
alive() {
  kill -0 "$1" 2>/dev/null || return 1
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [ "${stat%% *}" != Z ]
}

# pid_of STORE: the pid from our pid file, if that process is alive and is
# the one we started (its command line names our state dir).
pid_of() {
  local dir pid
  dir=$(store_dir "$1")
  [ -r "$dir/pid" ] || return 1
  pid=$(cat "$dir/pid" 2>/dev/null) || return 1
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  alive "$pid" || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$dir" || return 1
  printf '%s\n' "$pid"
}

# launch STORE CMD...: start CMD detached (own session, no inherited stdio)
# with its output appended to STORE's log, and record its pid.
launch() {
  local store=$1; shift
  local dir
  dir=$(store_dir "$store")
  printf '=== %s starting: %s\n' "$(date -u +%FT%TZ)" "$*" >>"$dir/log"
  nohup setsid "$@" >>"$dir/log" 2>&1 </dev/null &
  echo "$!" >"$dir/pid"
}

start_zk() { # DIR [NAME]
  local dir=$1 name=${2:-zk}
  mkdir -p "$dir/data"
  local port=$ZK_PORT
  [ "$name" = zk-tls ] && port=$ZK_TLS_PLAIN_PORT
  cat >"$dir/zoo.cfg" <<EOF
tickTime=$ZK_TICK_MS
dataDir=$dir/data
clientPort=$port
clientPortAddress=$HOST
# maxClientCnxns left at its default (60 per client address), as users run
# it: a client holds one connection (quorumlock-zk/tests/connections.rs).
# Long sessions for tests that count requests (keepalives out of the window).
maxSessionTimeout=600000
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr,mntr
EOF
  local cp=$ZK_JAR
  if [ "$name" = zk-tls ]; then
    # TLS needs the Netty connection factory (the plain port then uses it
    # too); Debian's zookeeper.jar manifest lacks these three Netty jars.
    cat >>"$dir/zoo.cfg" <<EOF
secureClientPort=$ZK_TLS_PORT
secureClientPortAddress=$HOST
serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory
ssl.keyStore.location=$CERTS/server-bundle.pem
ssl.keyStore.type=PEM
ssl.trustStore.location=$CERTS/ca.pem
ssl.trustStore.type=PEM
ssl.clientAuth=need
EOF
    cp+=":$JAVA_DIR/netty-codec.jar:$JAVA_DIR/netty-resolver.jar:$JAVA_DIR/netty-transport-native-unix-common.jar"
  fi
  [ -r "$JAVA_DIR/slf4j-simple.jar" ] && cp+=":$JAVA_DIR/slf4j-simple.jar"
  launch "$name" java -Xmx256m -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true \
    -Dzookeeper.admin.enableServer=false \
    -Dorg.slf4j.simpleLogger.showDateTime=true \
    -Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS \
    -cp "$cp" org.apache.zookeeper.server.quorum.QuorumPeerMain "$dir/zoo.cfg"
}

start_etcd() { # DIR BIN NAME CLIENT_PORT PEER_PORT [TLS flags...]
  local dir=$1 bin=$2 name=$3 cport=$4 pport=$5
  shift 5
  local curl=http://$HOST:$cport purl=http://$HOST:$pport
  [ $# -gt 0 ] && curl=https://$HOST:$cport
  mkdir -p "$dir"
  launch "$name" "$bin" --name "$name" --data-dir "$dir/data" \
    --listen-client-urls "$curl" --advertise-client-urls "$curl" \
    --listen-peer-urls "$purl" --initial-advertise-peer-urls "$purl" \
    --initial-cluster "$name=$purl" --initial-cluster-state new \
    --logger zap --log-outputs stderr "$@"
}

start_consul() {
  local dir=$1
  # CHECKPOINT_DISABLE and disable_update_check: no call home (loopback only).
  # Every test client dials from one address and each waiting acquire holds
  # a long poll: chaos.sh's explorer runs past the default cap of 200
  # connections per client address, which Consul enforces by closing them.
  CHECKPOINT_DISABLE=1 launch consul "$CONSUL_BIN" agent -dev \
    -bind "$HOST" -client "$HOST" -node quorumlock-dev \
    -hcl 'disable_update_check = true' \
    -hcl 'limits { http_max_conns_per_client = 4096 }' -pid-file "$dir/consul-agent.pid"
}

start_consul_tls() {
  local dir=$1
  # Its own ports, so that it runs beside the plain agent; DNS and gRPC off.
  CHECKPOINT_DISABLE=1 launch consul-tls "$CONSUL_BIN" agent -dev \
    -bind "$HOST" -client "$HOST" -node quorumlock-dev-tls \
    -hcl 'disable_update_check = true' \
    -hcl "ports { http = 18500, https = $CONSUL_TLS_HTTPS_PORT, dns = -1, grpc = -1, server = 18300, serf_lan = 18301, serf_wan = 18302 }" \
    -hcl "ca_file = \"$CERTS/ca.pem\"" -hcl "cert_file = \"$CERTS/server.pem\"" \
    -hcl "key_file = \"$CERTS/server-key.pem\"" -hcl 'verify_incoming_https = true' \
    -pid-file "$dir/consul-agent.pid"
}

start_redis_tls() {
  local dir=$1
  cat >"$dir/redis.conf" <<EOF
bind $HOST
port 0
tls-port $REDIS_TLS_PORT
tls-cert-file $CERTS/server.pem
tls-key-file $CERTS/server-key.pem
tls-ca-cert-file $CERTS/ca.pem
tls-auth-clients yes
save ""
appendonly no
dir $dir
proc-title-template "{title} {listen-addr} {server-mode} {config-file}"
EOF
  launch redis-tls "$REDIS_BIN" "$dir/redis.conf"
}

start_redis() {
  local dir=$1
  # The config file lives in the state dir, and the process title names it,
  # so that pid_of recognises our server (Redis rewrites its command line).
  cat >"$dir/redis.conf" <<EOF
bind $HOST
port $REDIS_PORT
save ""
appendonly no
dir $dir
proc-title-template "{title} {listen-addr} {server-mode} {config-file}"
EOF
  launch redis "$REDIS_BIN" "$dir/redis.conf"
}

# PostgreSQL refuses to run as root: the cluster belongs to the Debian
# package's `postgres` user, and the server runs as it (setpriv execs, so
# the recorded pid is the postmaster's). The database `quorumlock` is made
# once the server is ready (wait_healthy's probe connects to it, so it is
# made here, by a single-user run before the start).
start_postgres() {
  local dir=$1
  mkdir -p "$dir/data" "$dir/tls"
  # TLS on the same port (scripts/certs.sh's server certificate): the
  # user quorumlock-test (the client certificate's CN) logs in only over
  # TLS with that certificate; postgres is trusted on loopback as before.
  cp "$CERTS/server.pem" "$CERTS/server-key.pem" "$CERTS/ca.pem" "$dir/tls/"
  chown -R postgres:postgres "$dir"
  chmod 600 "$dir/tls/server-key.pem"
  local as=(setpriv --reuid=postgres --regid=postgres --init-groups)
  "${as[@]}" "$PG_BIN_DIR/initdb" -D "$dir/data" -U postgres --auth=trust \
    --no-sync -E UTF8 --locale=C >>"$dir/log" 2>&1 || fail_store postgres "initdb failed"
  printf 'CREATE DATABASE quorumlock\nCREATE ROLE "quorumlock-test" LOGIN SUPERUSER\n' |
    "${as[@]}" "$PG_BIN_DIR/postgres" --single -D "$dir/data" postgres >>"$dir/log" 2>&1 ||
    fail_store postgres "creating the database failed"
  { printf 'hostssl all quorumlock-test %s/32 cert\nhost all quorumlock-test %s/32 reject\n' "$HOST" "$HOST"
    cat "$dir/data/pg_hba.conf"; } >"$dir/pg_hba.conf"
  chown postgres:postgres "$dir/pg_hba.conf"
  launch postgres "${as[@]}" "$PG_BIN_DIR/postgres" -D "$dir/data" \
    -c listen_addresses="$HOST" -p "$POSTGRES_PORT" -c unix_socket_directories="$dir" \
    -c fsync=off -c synchronous_commit=off -c full_page_writes=off \
    -c max_connections=500 -c shared_buffers=64MB -c hba_file="$dir/pg_hba.conf" \
    -c ssl=on -c ssl_cert_file="$dir/tls/server.pem" -c ssl_key_file="$dir/tls/server-key.pem" \
    -c ssl_ca_file="$dir/tls/ca.pem"
}

start_store() { # STORE; sets STARTED=1 if it started it, 0 if already running
  local s=$1 dir pid p
  dir=$(store_dir "$s")
  STARTED=0
  if pid=$(pid_of "$s"); then
    log "$s: already running (pid $pid)"
    return 0
  fi
  for p in $(ports_of "$s"); do
    if tcp_open "$p"; then
      die "$s: port $HOST:$p is already in use by a process that this script did not start (state dir $STATE); stop it or use QUORUMLOCK_STATE of the run that started it"
    fi
  done
  rm -rf "$dir"
  mkdir -p "$dir"
  case $s in
    zk) start_zk "$dir" ;;
    etcd) start_etcd "$dir" "$ETCD_BIN" etcd "$ETCD_PORT" "$ETCD_PEER_PORT" ;;
    etcd35) start_etcd "$dir" "$ETCD35_BIN" etcd35 "$ETCD35_PORT" "$ETCD35_PEER_PORT" ;;
    consul) start_consul "$dir" ;;
    redis) start_redis "$dir" ;;
    zk-tls) start_zk "$dir" zk-tls ;;
    etcd-tls) start_etcd "$dir" "$ETCD_BIN" etcd-tls "$ETCD_TLS_PORT" "$ETCD_TLS_PEER_PORT" \
                --cert-file "$CERTS/server.pem" --key-file "$CERTS/server-key.pem" \
                --trusted-ca-file "$CERTS/ca.pem" --client-cert-auth ;;
    consul-tls) start_consul_tls "$dir" ;;
    redis-tls) start_redis_tls "$dir" ;;
    postgres) start_postgres "$dir" ;;
  esac
  log "$s: started (pid $(cat "$dir/pid")), log $dir/log"
  STARTED=1
}

fail_store() { # STORE MESSAGE
  local s=$1 dir pid
  dir=$(store_dir "$s")
  log "$s: $2; last lines of $dir/log:"
  tail -n 40 "$dir/log" >&2 2>/dev/null || true
  if pid=$(pid_of "$s"); then
    kill "$pid" 2>/dev/null || true
  fi
  exit 1
}

wait_healthy() { # STORE
  local s=$1 dir deadline
  dir=$(store_dir "$s")
  deadline=$((SECONDS + TIMEOUT))
  while :; do
    if healthy "$s"; then
      pid_of "$s" >/dev/null || fail_store "$s" "answers, but not from the process we started"
      log "$s: ready"
      return 0
    fi
    pid_of "$s" >/dev/null || fail_store "$s" "process exited"
    [ "$SECONDS" -lt "$deadline" ] || fail_store "$s" "not ready after ${TIMEOUT}s"
    sleep 0.2
  done
}

stop_store() { # STORE
  local s=$1 dir pid i
  dir=$(store_dir "$s")
  [ -d "$dir" ] || { log "$s: not running"; return 0; }
  if pid=$(pid_of "$s"); then
    log "$s: stopping pid $pid"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 300; i++)); do
      alive "$pid" || break
      sleep 0.1
    done
    if alive "$pid"; then
      log "$s: pid $pid still alive after 30s; SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      for ((i = 0; i < 50; i++)); do alive "$pid" || break; sleep 0.1; done
    fi
  else
    log "$s: not running (stale state removed)"
  fi
  rm -rf "$dir"
}

# ------------------------------------------------------------------- env ---

emit_env() {
  local s has_zk=0 has_etcd=0 has_consul=0 has_redis=0 has_tls=0 has_postgres=0
  for s in "$@"; do
    case $s in
      zk-tls) has_tls=1; echo "export QUORUMLOCK_TEST_ZK_TLS_URL=zk://$HOST:$ZK_TLS_PORT" ;;
      etcd-tls) has_tls=1; echo "export QUORUMLOCK_TEST_ETCD_TLS_URL=etcds://$HOST:$ETCD_TLS_PORT" ;;
      consul-tls) has_tls=1; echo "export QUORUMLOCK_TEST_CONSUL_TLS_URL=consuls://$HOST:$CONSUL_TLS_HTTPS_PORT" ;;
      redis-tls) has_tls=1; echo "export QUORUMLOCK_TEST_REDIS_TLS_URL=rediss://$HOST:$REDIS_TLS_PORT" ;;
      zk) has_zk=1; echo "export QUORUMLOCK_TEST_ZK_URL=zk://$HOST:$ZK_PORT" ;;
      etcd) has_etcd=1; echo "export QUORUMLOCK_TEST_ETCD_URL=etcd://$HOST:$ETCD_PORT" ;;
      etcd35) has_etcd=1; echo "export QUORUMLOCK_TEST_ETCD35_URL=etcd://$HOST:$ETCD35_PORT" ;;
      consul) has_consul=1; echo "export QUORUMLOCK_TEST_CONSUL_URL=consul://$HOST:$CONSUL_HTTP_PORT" ;;
      redis) has_redis=1; echo "export QUORUMLOCK_TEST_REDIS_URL=redis://$HOST:$REDIS_PORT" ;;
      postgres) has_postgres=1; has_tls=1
                echo "export QUORUMLOCK_TEST_POSTGRES_URL=postgres://postgres@$HOST:$POSTGRES_PORT/quorumlock"
                echo "export QUORUMLOCK_TEST_POSTGRES_TLS_URL=postgres://quorumlock-test@$HOST:$POSTGRES_PORT/quorumlock" ;;
    esac
  done
  if [ "$has_etcd" = 1 ]; then
    printf 'export QUORUMLOCK_ETCDCTL=%q\n' "$ETCDCTL_BIN"
    [ -x "$ETCDCTL35_BIN" ] && printf 'export QUORUMLOCK_ETCDCTL35=%q\n' "$ETCDCTL35_BIN"
  fi
  [ "$has_consul" = 1 ] && printf 'export QUORUMLOCK_CONSUL_BIN=%q\n' "$CONSUL_BIN"
  [ "$has_redis" = 1 ] && printf 'export QUORUMLOCK_REDIS_SERVER=%q\n' "$REDIS_BIN"
  if [ "$has_postgres" = 1 ]; then
    printf 'export QUORUMLOCK_PG_BIN_DIR=%q\n' "$PG_BIN_DIR"
    printf 'export QUORUMLOCK_PGBOUNCER=%q\n' "$PGBOUNCER_BIN"
  fi
  [ "$has_zk" = 1 ] && printf 'export QUORUMLOCK_CURATOR_CP=%q\n' "$(curator_classpath)"
  if [ "$has_tls" = 1 ]; then
    # The TLS servers' certificates (scripts/certs.sh): the CA, a client
    # certificate and key it signed, and an unrelated CA ("the wrong CA").
    printf 'export QUORUMLOCK_TEST_TLS_CA=%q\n' "$CERTS/ca.pem"
    printf 'export QUORUMLOCK_TEST_TLS_CERT=%q\n' "$CERTS/client.pem"
    printf 'export QUORUMLOCK_TEST_TLS_KEY=%q\n' "$CERTS/client-key.pem"
    printf 'export QUORUMLOCK_TEST_TLS_OTHER_CA=%q\n' "$CERTS/other-ca.pem"
  fi
  true
}

# ------------------------------------------------------------------ main ---

select_stores() {
  SELECTED=()
  local s a
  if [ $# -eq 0 ] || [ "$*" = all ]; then
    SELECTED=("${ALL_STORES[@]}")
    return
  fi
  # Keep the canonical order whatever order the arguments come in.
  for a in "$@"; do
    case " ${ALL_STORES[*]} " in *" $a "*) ;; *) log "unknown store '$a' (${ALL_STORES[*]})"; usage 2 ;; esac
  done
  for s in "${ALL_STORES[@]}"; do
    for a in "$@"; do
      if [ "$a" = "$s" ]; then SELECTED+=("$s"); break; fi
    done
  done
}

cmd_up() {
  install_stores "$@"
  mkdir -p "$STATE"
  local s started=()
  case " $* " in
    *-tls\ *|*\ postgres\ *) "$(dirname "$0")/certs.sh" "$CERTS" || die "making the test certificates failed" ;;
  esac
  for s in "$@"; do
    start_store "$s"
    if [ "$STARTED" = 1 ]; then started+=("$s"); fi
  done
  for s in "$@"; do
    wait_healthy "$s"
  done
  if [ ${#started[@]} -eq 0 ]; then log "all selected stores were already running"; fi
  emit_env "$@"
}

cmd_down() {
  local i
  for ((i = $# ; i >= 1; i--)); do stop_store "${!i}"; done
  # The certificates go with the last TLS server (PostgreSQL takes TLS too).
  compgen -G "$STATE/*-tls" >/dev/null || [ -d "$STATE/postgres" ] || rm -rf "$CERTS"
  rmdir "$STATE" 2>/dev/null || true
}

cmd_status() {
  local s pid dir rc=0 ports health
  for s in "$@"; do
    dir=$(store_dir "$s")
    ports=$(ports_of "$s"); ports=${ports%% *}
    if pid=$(pid_of "$s"); then
      if healthy "$s"; then health=healthy; else health=unhealthy; rc=3; fi
      printf '%-10s running  pid %-7s %s:%-5s %-9s log %s\n' "$s" "$pid" "$HOST" "$ports" "$health" "$dir/log"
    else
      rc=3
      if [ -d "$dir" ]; then
        printf '%-10s stopped  (stale state in %s)\n' "$s" "$dir"
      else
        printf '%-10s stopped\n' "$s"
      fi
    fi
  done
  return "$rc"
}

main() {
  [ $# -ge 1 ] || usage 2
  local cmd=$1; shift
  case $cmd in
    -h|--help|help) usage 0 ;;
  esac
  select_stores "$@"
  case $cmd in
    install) install_stores "${SELECTED[@]}" ;;
    up) cmd_up "${SELECTED[@]}" ;;
    down) cmd_down "${SELECTED[@]}" ;;
    status) cmd_status "${SELECTED[@]}" ;;
    env) emit_env "${SELECTED[@]}" ;;
    *) log "unknown command '$cmd'"; usage 2 ;;
  esac
}

main "$@"
