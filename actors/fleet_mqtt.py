"""Queue status broadcast for the reference render fleet: a retained MQTT message per node.

The reference fleet learns which hosts exist only from `queue_status/#` messages and claims from
`<hostname>:<queuePort>`, so ``hostname`` is this node's advertised host, the same host as in its
callbackOrigin. The message is retained, so a worker that subscribes later gets the current status.
"""

from __future__ import annotations

import json
import ssl
import threading
from typing import Any, Literal
from urllib.parse import urlsplit

from prerender_ray.config.render import Mqtt

DEFAULT_PORTS = {"mqtt": 1883, "mqtts": 8883, "ws": 80, "wss": 443}
FLUSH_S = 3.0  # on close: how long the last status may take to reach the broker


class StatusBroadcaster:
    def __init__(self, cfg: Mqtt, host: str, node: str, password: str | None, log: Any):
        self.prefix = cfg.topic_prefix
        self.topic = f"{cfg.topic_prefix}/{host}"
        self.host = host
        self._stale: set[str] = set()  # topics this node published under a previous name
        self.log = log
        self._current: bytes | None = None
        self._sent: Any = None  # the last status publish (its MQTTMessageInfo)
        self._lock = threading.Lock()
        import paho.mqtt.client as mqtt

        url = urlsplit(cfg.url)
        transport: Literal["websockets", "tcp"] = "websockets" if url.scheme in ("ws", "wss") else "tcp"
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=cfg.client_id or f"prerender-ray-{node}",
                                  transport=transport, clean_session=True)
        if url.scheme in ("mqtts", "wss"):
            self.client.tls_set(cert_reqs=ssl.CERT_REQUIRED)
        if transport == "websockets":
            self.client.ws_set_options(path=url.path or "/mqtt")
        if cfg.username:
            self.client.username_pw_set(cfg.username, password)
        self._closing = False
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.reconnect_delay_set(1, 30)
        self.client.connect_async(url.hostname or "127.0.0.1", url.port or DEFAULT_PORTS[url.scheme], keepalive=60)
        self.client.loop_start()

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, properties: Any = None) -> None:
        if getattr(reason, "is_failure", False):
            self.log.warning("mqtt connect refused", reason=str(reason))
            return
        self.log.info("mqtt connected", topic=self.topic)
        with self._lock:
            current, stale = self._current, list(self._stale)
        for topic in stale:
            self._clear(client, topic)
        if current is not None:  # a retained message may have been lost while we were away
            self._sent = client.publish(self.topic, current, qos=1, retain=True)

    def _on_disconnect(self, client: Any, userdata: Any, flags: Any, reason: Any, properties: Any = None) -> None:
        # Our own disconnect (on close) is routine; a broker that went away is worth a warning.
        routine = self._closing or not getattr(reason, "is_failure", True)
        (self.log.info if routine else self.log.warning)("mqtt disconnected", reason=str(reason))

    def forget(self, old_host: str) -> None:
        """This node published as ``old_host`` before (its host name changed): clear that retained
        topic, or the reference fleet keeps polling a dead address with its credentials."""
        topic = f"{self.prefix}/{old_host}"
        if not old_host or topic == self.topic:
            return
        with self._lock:
            self._stale.add(topic)
        if self.client.is_connected():
            self._clear(self.client, topic)

    def _clear(self, client: Any, topic: str) -> None:
        client.publish(topic, b"", qos=1, retain=True)  # an empty retained message deletes the topic
        self.log.info("mqtt topic of a previous host name cleared", topic=topic)

    def publish(self, status: str, updated_ms: int) -> None:
        payload = json.dumps({"hostname": self.host, "status": status, "updatedTime": updated_ms}).encode()
        with self._lock:
            self._current = payload
        if self.client.is_connected():
            self._sent = self.client.publish(self.topic, payload, qos=1, retain=True)

    def close(self) -> None:
        """Disconnect once the last status (``paused`` on a stop) reached the broker, or after
        ``FLUSH_S``: it stays retained while the node is away, so the fleet does not poll a node that
        is gone as if it had work."""
        self._closing = True
        sent = self._sent
        if sent is not None and self.client.is_connected():
            try:
                sent.wait_for_publish(FLUSH_S)
            except (RuntimeError, ValueError) as e:  # not queued, or the connection went meanwhile
                self.log.warning("mqtt last status not confirmed", error=repr(e))
        try:
            self.client.disconnect()
        finally:
            self.client.loop_stop()
