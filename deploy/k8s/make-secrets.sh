#!/bin/sh
# Create the three Secrets Kinference's NATS needs, in kinference-system:
#   kinference-nats-auth       one random password per NATS user (policy-compiler,
#                              telemetry-collector, router, classifier; observer: read-only,
#                              for people following decisions with kinfctl events) and
#                              the cluster routes' password (route)
#   kinference-nats-tls        ca.crt, tls.crt, tls.key: a private CA and NATS's server
#                              certificate for nats.kinference-system.svc and each server
#                              (nats-N.nats-headless.kinference-system.svc)
#   kinference-nats-routes-tls ca.crt, tls.crt, tls.key: the cluster routes' own CA and
#                              certificate for *.nats-headless (server and client: routes
#                              are mutual TLS, and no client certificate can open one)
#
#   deploy/k8s/make-secrets.sh            apply them with kubectl (existing ones are kept)
#   deploy/k8s/make-secrets.sh --print    print them as YAML instead (for GitOps, sealed secrets...)
#
# Needs openssl. With cert-manager, issue kinference-nats-tls and
# kinference-nats-routes-tls from your own issuers instead (same keys; the routes'
# certificate for both server and client auth) and run with --auth-only.
set -eu
NS=${NAMESPACE:-kinference-system}
MODE=apply
AUTH_ONLY=0
for arg in "$@"; do
  case "$arg" in
    --print) MODE=print ;;
    --auth-only) AUTH_ONLY=1 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "make-secrets.sh: unknown argument $arg (see --help)" >&2; exit 1 ;;
  esac
done
if [ "$MODE" = apply ] && ! kubectl get namespace "$NS" >/dev/null 2>&1; then
  kubectl create namespace "$NS"   # kubectl apply -k deploy/k8s then labels it
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# A password starts with a letter: nats-server parses an environment
# variable it substitutes as a config value, and "9f..." is not one.
pw() { printf 'k%s' "$(openssl rand -hex 24)"; }
b64() { base64 < "$1" | tr -d '\n'; }

exists() { [ "$MODE" = apply ] && kubectl -n "$NS" get secret "$1" >/dev/null 2>&1; }

emit() {  # emit NAME FILE: FILE is a Secret manifest
  if [ "$MODE" = print ]; then cat "$2"; echo "---";
  elif exists "$1"; then echo "secret $NS/$1 exists: kept" >&2;
  else kubectl apply -f "$2"; fi
}

cat > "$TMP/auth.yaml" <<YAML
apiVersion: v1
kind: Secret
metadata: {name: kinference-nats-auth, namespace: $NS, labels: {app.kubernetes.io/part-of: kinference}}
type: Opaque
stringData:
  policy-compiler: "$(pw)"
  telemetry-collector: "$(pw)"
  router: "$(pw)"
  classifier: "$(pw)"
  observer: "$(pw)"
  route: "$(pw)"
YAML
emit kinference-nats-auth "$TMP/auth.yaml"

HEADLESS="DNS:*.nats-headless,DNS:*.nats-headless.$NS,DNS:*.nats-headless.$NS.svc,DNS:*.nats-headless.$NS.svc.cluster.local"

# cert KEY CA NAME SAN USAGE: a certificate signed by CA (its .crt and .key in $TMP)
cert() {
  printf '[req]\ndistinguished_name = dn\n[dn]\n[ext]\nsubjectAltName = %s\nextendedKeyUsage = %s\n' "$4" "$5" \
    > "$TMP/$1.cnf"
  openssl req -newkey rsa:3072 -nodes -subj "/CN=$3" -keyout "$TMP/$1.key" -out "$TMP/$1.csr" 2>/dev/null
  openssl x509 -req -in "$TMP/$1.csr" -CA "$TMP/$2.crt" -CAkey "$TMP/$2.key" -CAcreateserial -days 825 \
    -extfile "$TMP/$1.cnf" -extensions ext -out "$TMP/$1.crt" 2>/dev/null
}
ca() { openssl req -x509 -newkey rsa:3072 -nodes -days 3650 -subj "/CN=$2" -keyout "$TMP/$1.key" -out "$TMP/$1.crt" 2>/dev/null; }

if [ "$AUTH_ONLY" = 0 ]; then
  # the routes: a CA of their own, so that no client certificate can open a route
  ca routes-ca kinference-nats-routes-ca
  cert routes routes-ca "nats-headless.$NS.svc" "$HEADLESS,DNS:localhost,IP:127.0.0.1" "serverAuth,clientAuth"
  cat > "$TMP/routes.yaml" <<YAML
apiVersion: v1
kind: Secret
metadata: {name: kinference-nats-routes-tls, namespace: $NS, labels: {app.kubernetes.io/part-of: kinference}}
type: kubernetes.io/tls
data:
  ca.crt: $(b64 "$TMP/routes-ca.crt")
  tls.crt: $(b64 "$TMP/routes.crt")
  tls.key: $(b64 "$TMP/routes.key")
YAML
  emit kinference-nats-routes-tls "$TMP/routes.yaml"
fi

if [ "$AUTH_ONLY" = 0 ]; then
  ca ca kinference-nats-ca
  cert tls ca "nats.$NS.svc" "DNS:nats,DNS:nats.$NS,DNS:nats.$NS.svc,DNS:nats.$NS.svc.cluster.local,$HEADLESS,DNS:localhost,IP:127.0.0.1" serverAuth
  cat > "$TMP/tls.yaml" <<YAML
apiVersion: v1
kind: Secret
metadata: {name: kinference-nats-tls, namespace: $NS, labels: {app.kubernetes.io/part-of: kinference}}
type: kubernetes.io/tls
data:
  ca.crt: $(b64 "$TMP/ca.crt")
  tls.crt: $(b64 "$TMP/tls.crt")
  tls.key: $(b64 "$TMP/tls.key")
YAML
  emit kinference-nats-tls "$TMP/tls.yaml"
fi
