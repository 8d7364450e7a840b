#!/usr/bin/env bash
# Install what the CDC stack needs, once; a second run checks and downloads nothing.
#   1. Debian packages: PostgreSQL, Redis, a JDK 17 and Maven
#   2. the unprivileged service user that runs PostgreSQL and OpenSearch (when run as root)
#   3. the Python virtual environment (.venv): requirements.lock (exact versions, sha256
#      hashes), then this project
#   4. the JVM artifacts (Kafka, Kafka Connect, Debezium, OpenSearch, Spark jars),
#      resolved by Maven from jvm/pom.xml into .cache/jvm, and the pipeline's own Connect
#      transform (jvm/transforms) and signal actions (jvm/signals) built there; Spark's S3
#      connector (hadoop-aws and the AWS SDK, about 690 MB, for a warehouse on object
#      storage) and the tests' S3 server (S3Proxy), jvm/s3
#
# CDC_INSTALL_S3=1 ./install.sh (`make install-s3`) adds Spark's S3 connector, kept by the
# installs after it (CDC_INSTALL_S3=0 removes it); without it an s3:// warehouse says to
# install it.
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$(pwd)
CACHE=${CDC_CACHE_DIR:-$ROOT/.cache}
VENV=${CDC_VENV:-$ROOT/.venv}
SERVICE_USER=${CDC_SERVICE_USER:-cdc}
PYTHON=${PYTHON:-python3}
# Spark's S3 connector: asked for (CDC_INSTALL_S3=1, `make install-s3`), or kept once there
if [ -d "$CACHE/jvm/spark/s3a-jars" ]; then INSTALL_S3=${CDC_INSTALL_S3:-1}; else INSTALL_S3=${CDC_INSTALL_S3:-0}; fi
started=$(date +%s)

step() { printf '\033[1m[%s/5] %s\033[0m\n' "$1" "$2"; }
done_() { printf '      %s\n' "$*"; }
die() { printf 'install: %s\n' "$*" >&2; exit 1; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@";
  elif command -v sudo >/dev/null; then sudo "$@";
  else die "need root to run: $* (run install.sh as root, or install it yourself)"; fi
}

step 1 "system packages"
packages=(postgresql redis-server openjdk-17-jdk-headless maven xz-utils)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  done_ "already installed: ${packages[*]}"
else
  done_ "installing: ${missing[*]}"
  as_root apt-get update -qq
  # the packages' own services are not wanted: the project runs private instances
  as_root env DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 \
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1 \
    || die "apt-get could not install: ${missing[*]}"
  done_ "installed: ${missing[*]}"
fi

step 2 "service user"
if [ "$(id -u)" -ne 0 ]; then
  done_ "not root: every component runs as $(id -un)"
elif id "$SERVICE_USER" >/dev/null 2>&1; then
  done_ "'$SERVICE_USER' exists (PostgreSQL and OpenSearch refuse to run as root)"
else
  useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$SERVICE_USER"
  done_ "created '$SERVICE_USER' (PostgreSQL and OpenSearch refuse to run as root)"
fi

step 3 "Python environment ($VENV)"
stamp="$VENV/.cdc-installed"
want=$(cat pyproject.toml requirements.lock | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$VENV/bin/python" -c 'import cdc, pyspark' 2>/dev/null; then
  done_ "up to date"
else
  "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || die "Python 3.11+ is needed ($PYTHON is $("$PYTHON" --version 2>&1)); set PYTHON=python3.11"
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  done_ "installing the locked dependencies from requirements.lock (pyspark is about 450 MB)..."
  # Exact versions, every file checked against its sha256 in the lock. First the locked pip and
  # setuptools (wheels); then the rest, built without build isolation, so that an sdist (pyspark
  # is published only as one) is built with that setuptools, not with one fetched unchecked.
  awk '/^(pip|setuptools)==/ {on = 1} on {print; if ($0 !~ /\\$/) on = 0}' requirements.lock \
    > "$VENV/.cdc-build-tools.lock"
  "$VENV/bin/pip" install --quiet --require-hashes --only-binary :all: -r "$VENV/.cdc-build-tools.lock" \
    || die "pip could not install pip and setuptools from requirements.lock; see the messages above"
  "$VENV/bin/pip" install --progress-bar on --require-hashes --no-build-isolation -r requirements.lock \
    || die "pip could not install requirements.lock; see the messages above"
  # the project itself: no dependencies of its own (all locked above), built with the locked
  # setuptools (setuptools warns about editable installs at length: that noise is filtered out)
  "$VENV/bin/pip" install --quiet --no-deps --no-build-isolation -e . \
    2> >(grep -vE 'BuildBackendWarning|^\s*(!!|\*+|Please be careful|name as your|with strategy|$)' >&2) \
    || die "pip could not install the project; see the messages above"
  echo "$want" > "$stamp"
  done_ "installed"
fi

step 4 "JVM artifacts ($CACHE/jvm)"
stamp="$CACHE/jvm/.cdc-installed"
want=$( (cat jvm/pom.xml jvm/*/pom.xml $(find jvm/transforms/src jvm/signals/src jvm/functions/src -type f | sort); echo "s3=$INSTALL_S3") | sha256sum | cut -d' ' -f1)
s3_option=()
[ "$INSTALL_S3" = 0 ] && s3_option=(-Dcdc.without-s3)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  done_ "up to date"
else
  done_ "resolving Kafka, Kafka Connect, Debezium, OpenSearch, the Spark jars and its S3 connector with Maven (about 300 MB; with CDC_INSTALL_S3=1, 1 GB), and building the pipeline's Connect transform..."
  mkdir -p "$CACHE/jvm"
  rm -rf "$CACHE/jvm/kafka" "$CACHE/jvm/spark" "$CACHE/jvm/connect-plugins" "$CACHE/jvm/opensearch" "$CACHE/jvm/opensearch-plugins" "$CACHE/jvm/postgres" "$CACHE/jvm/s3proxy" "$CACHE/jvm/.markers"
  # progress: one line per component as Maven reaches it; the whole log goes to maven.log
  # -C: a download whose checksum does not match the repository's fails the install
  if ! mvn -B -C -ntp -f jvm/pom.xml -Dcdc.cache="$CACHE/jvm" "${s3_option[@]}" package 2>&1 \
      | tee "$CACHE/jvm/maven.log" \
      | sed -un 's/^\[INFO\] Building cdc-\([a-z0-9]*\).*\(\[[0-9]\/[0-9]\]\)/      \2 \1/p'; then
    grep -E '^\[ERROR\]' "$CACHE/jvm/maven.log" | head -3 >&2
    die "Maven could not resolve the JVM artifacts; full log: $CACHE/jvm/maven.log"
  fi
  # PostgreSQL 14, 16, 17, 18 (postgres.version): each server's archive, extracted where
  # the service user that runs it can read it
  for archive in "$CACHE"/jvm/postgres/*/*.txz; do
    tar -xJf "$archive" -C "$(dirname "$archive")" && rm -f "$archive" \
      || die "could not extract $archive (is xz-utils installed?)"
  done
  chmod -R a+rX "$CACHE/jvm/postgres"
  echo "$want" > "$stamp"
  done_ "installed: $(du -sh "$CACHE/jvm" | cut -f1)"
fi

step 5 "Spark driver's class archive"
# every command's Spark driver maps the classes it loads at its start from one file (JDK
# class data sharing, cdc/core/class_archive.py): built once per JDK, pyspark and jars
done_ "$("$VENV/bin/python" -m cdc.core.class_archive 2>/dev/null | tail -1)"

printf 'install: done in %ss\n' "$(( $(date +%s) - started ))"
