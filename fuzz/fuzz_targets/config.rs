//! A configuration file's text: TOML syntax, every key's type and range, the checks
//! across keys. Any text must give a config or an error, never a panic.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let result = abridge::Config::from_sources(Some((Path::new("fuzz.toml"), text)), Vec::new());
    if let Err(e) = result {
        // The message is what an operator reads: rendering it must not panic either.
        let _ = e.to_string();
    }
});
