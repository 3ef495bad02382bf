#!/usr/bin/env bash
# Runs a command with a throwaway PostgreSQL server beside it.
#
#   scripts/with-postgres.sh cargo test --workspace
#
# Installs PostgreSQL from Debian's packages if no server is found, starts a
# cluster in a temporary directory on a free loopback port (TLS on, with a
# throwaway self-signed certificate; plain connections allowed too), exports
# its address as MNEME_TEST_PG and the certificate's path as
# MNEME_TEST_PG_CA, runs the command, then stops the cluster and removes the
# directory. The command's exit status is the script's. For a test that stops
# and starts the server itself (on a cluster of its own: run this script
# around a command that waits), it also exports MNEME_TEST_PG_CTL (pg_ctl on
# the cluster, as the server's user) and MNEME_TEST_PG_OPTIONS (the server's
# options, for `$MNEME_TEST_PG_CTL -o "$MNEME_TEST_PG_OPTIONS" start`).
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"

find_bin() {
    if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
        dirname "$(readlink -f "$(command -v initdb)")"
        return
    fi
    ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1
}

apt_install() {
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >&2
}

bin=$(find_bin)
if [ -z "$bin" ] || [ ! -x "$bin/postgres" ]; then
    echo "with-postgres: no PostgreSQL server found; installing Debian's package" >&2
    apt_install postgresql
    bin=$(find_bin)
fi
command -v openssl >/dev/null || apt_install openssl
[ -x "$bin/postgres" ] || { echo "with-postgres: no postgres binary after install" >&2; exit 1; }

# The server refuses to run as root: run it as the package's user.
as_pg=()
if [ "$(id -u)" -eq 0 ]; then
    id postgres >/dev/null 2>&1 || useradd --system --home-dir /nonexistent --shell /usr/sbin/nologin postgres
    as_pg=(runuser -u postgres --)
fi

dir=$(mktemp -d /tmp/mneme-pg.XXXXXX)
chmod 755 "$dir"
[ ${#as_pg[@]} -eq 0 ] || chown postgres "$dir"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

stop() {
    "${as_pg[@]}" "$bin/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true
    rm -rf "$dir"
}
trap stop EXIT
trap "exit 130" INT
trap "exit 143" TERM

"${as_pg[@]}" "$bin/initdb" -D "$dir/data" -U mneme -A trust --no-sync -E UTF8 >"$dir/initdb.log" 2>&1 \
    || { cat "$dir/initdb.log" >&2; exit 1; }
# A throwaway CA, and the server's certificate signed by it.
printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n' >"$dir/server.ext"
{ openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=mneme test CA" \
      -keyout "$dir/ca.key" -out "$dir/ca.crt" \
  && openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" \
      -keyout "$dir/server.key" -out "$dir/server.csr" \
  && openssl x509 -req -in "$dir/server.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
      -CAcreateserial -days 2 -extfile "$dir/server.ext" -out "$dir/server.crt"; } >/dev/null 2>&1 \
    || { echo "with-postgres: openssl could not make the test certificates" >&2; exit 1; }
options="-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=300 -c ssl=on -c ssl_cert_file=$dir/server.crt -c ssl_key_file=$dir/server.key"
chmod 600 "$dir/server.key"
chmod 644 "$dir/server.crt" "$dir/ca.crt"
[ ${#as_pg[@]} -eq 0 ] || chown postgres "$dir/server.key" "$dir/server.crt"
"${as_pg[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
    -o "$options" start >/dev/null \
    || { cat "$dir/server.log" >&2; exit 1; }

export MNEME_TEST_PG="postgres://mneme@127.0.0.1:$port/postgres"
export MNEME_TEST_PG_CA="$dir/ca.crt"
export MNEME_TEST_PG_CTL="${as_pg[*]} $bin/pg_ctl -D $dir/data -l $dir/server.log -w -t 60"
export MNEME_TEST_PG_OPTIONS="$options"
echo "with-postgres: PostgreSQL $("$bin/postgres" --version | awk '{print $3}') at $MNEME_TEST_PG" >&2
# The command runs in the background so that a signal to this script stops
# the cluster at once (bash runs traps only between foreground commands).
set +e
"$@" &
child=$!
trap 'kill -TERM "$child" 2>/dev/null; exit 130' INT
trap 'kill -TERM "$child" 2>/dev/null; exit 143' TERM
wait "$child"
status=$?
set -e
exit $status
