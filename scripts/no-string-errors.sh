#!/usr/bin/env bash
# Fails when crate source (crates/*/src) names a `Result<_, String>`: errors are typed
# (thiserror in libraries, anyhow in binaries; issue 17). The allowlist is empty on purpose.
# Generic arguments are matched with their nesting, so `Result<BTreeMap<String, String>, E>`
# is not mistaken for one.
set -euo pipefail
cd "$(dirname "$0")/.."
found=$(find crates/*/src -name '*.rs' -print0 | xargs -0 perl -0777 -ne '
  while (/\bResult\s*(<(?:->|[^<>]|(?1))*>)/g) {
    my $pos = pos();
    my $args = substr($1, 1, -1);
    1 while $args =~ s/<(?:->|[^<>])*>//g;
    my @parts = split /,/, $args;
    my $err = $parts[-1] // "";
    $err =~ s/^\s+|\s+$//g;
    if (@parts >= 2 && $err =~ /^(?:std::string::)?String$/) {
      my $line = 1 + (() = substr($_, 0, $pos) =~ /\n/g);
      print "$ARGV:$line\n";
    }
    pos() = $pos;
  }')
if [ -n "$found" ]; then
  echo "Result<_, String> in crate source (use a thiserror type, or anyhow in a binary):" >&2
  echo "$found" >&2
  exit 1
fi
