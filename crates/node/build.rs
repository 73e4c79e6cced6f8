// The linker settings a Node addon needs on each platform (on macOS, Node's symbols resolved at
// load time).
fn main() {
    napi_build::setup();
}
