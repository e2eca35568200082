//! The steps several commands share: attach, detach, bringing a volume up
//! or down through systemd, inspecting one, and capacity accounting. They
//! return data and print nothing; the commands above decide what to say.

pub mod activate;
pub mod attach;
pub mod boot_verdict;
pub mod capacity;
pub mod detach;
pub mod inspect;
