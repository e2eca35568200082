//! What a volume is: its spec (mode, file system, sector size), its id and
//! how a command names it, sizes, what its backing file holds (the content
//! probe, the GPT layout), opening that file safely, the marks a create or
//! a grow leaves on it, and the file system tools that make and grow it.

pub mod archive;
pub mod backing_file;
pub mod creating_mark;
pub mod filesystem;
pub mod gpt_layout;
pub mod growing_mark;
pub mod id;
pub mod kept_mark;
pub mod luks;
pub mod probe;
pub mod reference;
pub mod size;
pub mod spec;
