//! Loop devices: the kernel's ioctls behind safe handles, binding a file
//! to a free device, and finding the devices that hold a file.

mod allocate;
mod device;
mod discard;
mod held_elsewhere;
pub mod ioctl;
mod unwatched;

pub use allocate::{
    bind_to_free_device, cancel_pending_detach, release_at_last_close, restore_pending_detach,
    uses_direct_io, BindOptions, Bound,
};
pub use device::{
    bound_devices, bound_statuses, devices_backed_by, devices_holding, devices_of_file,
    parent_loop_of, BoundLoops, LockedLoopDevice, LoopDevice, LoopStatus, LOOP_CONTROL,
};
pub use discard::{forbid_discards, renew_if_discards_left_off, DiscardLimits};
pub use held_elsewhere::held_by_us_alone;
