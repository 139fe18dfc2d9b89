"""The queue status broadcast against a real MQTT broker (Debian's mosquitto)."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time

import httpx
import paho.mqtt.client as mqtt
import pytest

from tests.support import deploy_on, free_port, wait_for


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    port = free_port()
    conf = tmp_path_factory.mktemp("mqtt") / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n")
    proc = subprocess.Popen([exe, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: _connectable(port), timeout=10, what="mosquitto")
        yield port
    finally:
        proc.terminate()
        proc.wait(5)


def _connectable(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class Subscriber:
    """What a reference render worker does: subscribe to queue_status/# and keep the last message."""

    def __init__(self, port: int):
        self.messages: list[dict] = []
        self.lock = threading.Lock()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"worker-{time.time_ns()}")
        self.client.on_connect = lambda c, *_: c.subscribe("queue_status/#", qos=1)
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()

    def _on_message(self, client, userdata, msg) -> None:
        with self.lock:
            self.messages.append({"topic": msg.topic, "retain": msg.retain, **json.loads(msg.payload)})

    def last(self) -> dict | None:
        with self.lock:
            return self.messages[-1] if self.messages else None

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


def test_every_status_change_is_a_retained_message_a_late_worker_still_gets(ray_cluster, tmp_path, broker) -> None:
    d = deploy_on(ray_cluster, tmp_path / "data", {"fleet": {"mqtt": {"url": f"mqtt://127.0.0.1:{broker}"}}})
    sub = Subscriber(broker)
    try:
        first = wait_for(lambda: (m := sub.last()) and m["status"] in ("empty", "queued") and m, timeout=30,
                         what="a live status")
        assert first["topic"] == "queue_status/127.0.0.1"
        assert first["hostname"] == "127.0.0.1"  # the host the fleet claims from, as in callbackOrigin
        assert isinstance(first["updatedTime"], int)

        httpx.post(f"{d.url}/render_queue/pause")
        paused = wait_for(lambda: (m := sub.last()) and m["status"] == "paused" and m, timeout=10, what="paused")
        assert paused["updatedTime"] >= first["updatedTime"]

        late = Subscriber(broker)  # a worker started now receives the retained current status
        try:
            retained = wait_for(lambda: late.last(), timeout=10, what="the retained message")
            assert retained["status"] == "paused" and retained["retain"] is True
        finally:
            late.close()

        httpx.post(f"{d.url}/render_queue/resume")
        wait_for(lambda: (m := sub.last()) and m["status"] != "paused", timeout=10, what="resumed")
    finally:
        sub.close()
        d.stop()
