// gitlab-ci-local imports `re2` (native bindings: a node-gyp build of about 4 minutes on 2 cores,
// whose prebuilt binary cannot be downloaded here) as `new RE2(source, flags)`, then uses
// `.test()` and `String.prototype.match(re)`. re2-wasm is the same RE2 engine compiled to
// WebAssembly; it exports the class by name and refuses patterns without the "u" flag, which
// RE2 (always UTF-8) does not need. This module gives gitlab-ci-local that class as it expects it.
"use strict";
const { RE2: WasmRE2 } = require("re2-wasm");

class RE2 extends WasmRE2 {
  constructor(source, flags) {
    const given = flags ?? (source instanceof RegExp || source instanceof WasmRE2 ? source.flags : "");
    super(source, String(given).includes("u") ? given : `${given}u`);
  }
}

module.exports = RE2;
