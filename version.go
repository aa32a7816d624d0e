package main

// version is this build's version, stamped at build time with -ldflags "-X main.version=..." (the
// Dockerfile and .ci/packaging do); `pulse version` prints it, and the sidecar sends it in its webhook
// User-Agent and logs it when it listens.
var version = "dev"
