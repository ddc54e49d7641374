#!/usr/bin/env bash
# Puts Debian's redis-server and redis-cli, with the libraries they link that a
# bare machine may lack, into .whl/redis/ (an ignored folder the device tool
# carries): tools/cuda_run.sh's bench-prefix-store-redis starts it there.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl/redis/lib
cp /usr/bin/redis-server /usr/bin/redis-cli .whl/redis/ 2>/dev/null || cp "$(readlink -f /usr/bin/redis-server)" .whl/redis/redis-server
for bin in .whl/redis/redis-server .whl/redis/redis-cli; do
  ldd "$bin" | awk '/=> \// {print $3}' | grep -vE '/(libc|libm|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' \
    | xargs -r -I{} cp -L {} .whl/redis/lib/
done
du -sh .whl/redis
