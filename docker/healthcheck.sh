#!/usr/bin/env bash
# The image's HEALTHCHECK: GET /healthz on the operations server at
# $ACKPROXY_METRICS, through bash's /dev/tcp (the slim image has no curl or
# wget). Healthy means the process answers; whether Redis does is for
# /readyz: restarting the proxy would not bring Redis back.
set -u
addr=${ACKPROXY_METRICS:-127.0.0.1:7380}
host=${addr%:*}
port=${addr##*:}
host=${host#[}
host=${host%]}
# An address that listens everywhere is reached on loopback.
case $host in
  0.0.0.0) host=127.0.0.1 ;;
  ::) host=::1 ;;
esac
case $host in
  *:*) name="[$host]" ;;
  *) name=$host ;;
esac
exec 3<>"/dev/tcp/$host/$port" || exit 1
printf 'GET /healthz HTTP/1.0\r\nHost: %s\r\n\r\n' "$name" >&3
read -r -t 3 _ status _ <&3 || exit 1
[ "$status" = 200 ]
