"""The controller's preflight: the inventory's reader (inventory), its checks (checks) and the roles' value rules
(rules). Controller code: the action plugins import it; nothing here is sent to a host."""
