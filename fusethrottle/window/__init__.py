"""The window: un-synced bytes, the gate writers wait at, background syncs and the window's size."""
