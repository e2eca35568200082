//! The steps several commands share: attach, detach, bringing a volume up
//! or down through systemd, an encrypted volume's mapping, inspecting one, capacity accounting, and a
//! copy's own identity. They return data and print nothing; the commands
//! above decide what to say.

pub mod activate;
pub mod attach;
pub mod boot_verdict;
pub mod capacity;
pub mod detach;
pub mod encryption;
pub mod identity;
pub mod inspect;
pub mod take_over;
