#!/usr/bin/env bash
# Builds the Java peers of `make bench` into $EOPIPE_CACHE/bench-peers-<hash>/ and prints the
# classpath (the jar and its runtime dependencies). The hash covers pom.xml, this script and the
# sources, so an edit rebuilds and an unchanged tree reuses the jar. Dependencies come from
# Maven Central through Maven (its local repository makes later runs offline); the compile is
# plain javac --release 17 (no build plugins to download).
source "$(dirname "$0")/../../hack/lib.sh"
here="$REPO_ROOT/bench/peers"
hash="$(cd "$here" && find pom.xml build.sh src -type f | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16)"
dest="$EOPIPE_CACHE/bench-peers-$hash"
if [[ -f "$dest/.complete" ]]; then
  note "bench peers: cached in $dest"
else
  rm -rf "$dest.tmp" && mkdir -p "$dest.tmp/classes"
  step "Building the Java bench peers (Kafka Streams, copiers) into $dest"
  maven_runtime_deps "$here/pom.xml" "$dest.tmp/libs"
  find "$here/src/main/java" -name '*.java' > "$dest.tmp/sources.txt"
  javac --release 17 -nowarn -d "$dest.tmp/classes" -cp "$dest.tmp/libs/*" @"$dest.tmp/sources.txt"
  jar --create --file "$dest.tmp/eopipe-bench-peers.jar" -C "$dest.tmp/classes" .
  rm -rf "$dest.tmp/classes" "$dest.tmp/sources.txt"
  mark_complete "$dest"
fi
echo "$dest/eopipe-bench-peers.jar:$dest/libs/*"
