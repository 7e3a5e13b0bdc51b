-- Which of a network's sources served its watcher's last round (the URL with its credentials
-- hidden): watcher health, `payrecon stuck` and /metrics show it.
ALTER TABLE watcher_health ADD COLUMN active_source TEXT;
