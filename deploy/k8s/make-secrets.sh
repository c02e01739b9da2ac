#!/bin/sh
# Create the two Secrets Kinference's NATS needs, in kinference-system:
#   kinference-nats-auth  one random password per NATS user (policy-compiler,
#                         telemetry-collector, router, classifier; observer: read-only,
#                         for people following decisions with kinfctl events)
#   kinference-nats-tls   ca.crt, tls.crt, tls.key: a private CA and NATS's
#                         server certificate for nats.kinference-system.svc
#
#   deploy/k8s/make-secrets.sh            apply them with kubectl (existing ones are kept)
#   deploy/k8s/make-secrets.sh --print    print them as YAML instead (for GitOps, sealed secrets...)
#
# Needs openssl. With cert-manager, issue kinference-nats-tls from your own
# issuer instead (same keys: ca.crt, tls.crt, tls.key) and run with --auth-only.
set -eu
NS=${NAMESPACE:-kinference-system}
MODE=apply
AUTH_ONLY=0
for arg in "$@"; do
  case "$arg" in
    --print) MODE=print ;;
    --auth-only) AUTH_ONLY=1 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
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
YAML
emit kinference-nats-auth "$TMP/auth.yaml"

if [ "$AUTH_ONLY" = 0 ]; then
  openssl req -x509 -newkey rsa:3072 -nodes -days 3650 -subj "/CN=kinference-nats-ca" \
    -keyout "$TMP/ca.key" -out "$TMP/ca.crt" 2>/dev/null
  cat > "$TMP/san.cnf" <<CNF
[req]
distinguished_name = dn
[dn]
[ext]
subjectAltName = DNS:nats,DNS:nats.$NS,DNS:nats.$NS.svc,DNS:nats.$NS.svc.cluster.local,DNS:localhost,IP:127.0.0.1
extendedKeyUsage = serverAuth
CNF
  openssl req -newkey rsa:3072 -nodes -subj "/CN=nats.$NS.svc" -keyout "$TMP/tls.key" -out "$TMP/tls.csr" 2>/dev/null
  openssl x509 -req -in "$TMP/tls.csr" -CA "$TMP/ca.crt" -CAkey "$TMP/ca.key" -CAcreateserial -days 825 \
    -extfile "$TMP/san.cnf" -extensions ext -out "$TMP/tls.crt" 2>/dev/null
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
