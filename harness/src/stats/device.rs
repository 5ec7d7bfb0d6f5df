//! A device profile's identity as a results folder records it: two figures priced with different
//! constants are not comparable even when the profiles share a name.

use serde::Serialize;

/// The profile's name and a hash of its constants (a profile edited under the same name is
/// another profile). `None` when the constants do not serialize.
pub fn device_identity(name: &str, profile: &impl Serialize) -> Option<String> {
    let json = serde_json::to_string(profile).ok()?;
    let hash = blake3::hash(json.as_bytes()).to_hex();
    Some(format!("{} ({})", name, &hash[..16]))
}
