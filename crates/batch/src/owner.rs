//! Who a Batch API object belongs to: the API key that created it, or no key.

/// The owner of a file or batch, recorded when it is created. `Owner::key(id)`:
/// made with an API key (`id` is a stable digest of the key, never the key);
/// `Owner::NONE`: made on a server without keys, by the offline run, or before
/// owners were recorded (schema 0). A request sees only objects whose owner
/// equals its own, so a key never sees another key's objects nor ownerless
/// ones, and a keyless server sees only ownerless ones.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Owner(Option<String>);

impl Owner {
    pub const NONE: Owner = Owner(None);

    pub fn key(id: impl Into<String>) -> Owner {
        Owner(Some(id.into()))
    }

    /// The key's digest (`None`: no key), as stored in the `owner` column.
    pub fn id(&self) -> Option<&str> {
        self.0.as_deref()
    }
}
