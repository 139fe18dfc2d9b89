"""The queue status broadcast against a real MQTT broker (Debian's mosquitto): on one node's real parts
without Ray (``tests.localnode``), and a keeper killed and restarted by Ray."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time

import httpx
import paho.mqtt.client as mqtt
import pytest

from tests.localnode import LocalNode
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
        with self.lock:  # an empty payload clears a retained topic
            body = json.loads(msg.payload) if msg.payload else {"cleared": True}
            self.messages.append({"topic": msg.topic, "retain": msg.retain, **body})

    def of(self, topic: str) -> list[dict]:
        with self.lock:
            return [m for m in self.messages if m["topic"] == topic]

    def last(self) -> dict | None:
        with self.lock:
            return self.messages[-1] if self.messages else None

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


def test_every_status_change_is_a_retained_message_a_late_worker_still_gets(tmp_path, broker) -> None:
    d = LocalNode.start(tmp_path / "data", {"fleet": {"mqtt": {"url": f"mqtt://127.0.0.1:{broker}"}}})
    sub = Subscriber(broker)
    stopped = False
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
        resumed = wait_for(lambda: (m := sub.last()) and m["status"] != "paused" and m, timeout=10, what="resumed")

        d.stop()  # as `down` or SIGTERM to `up`: paused first, and it stays retained while the node is away
        stopped = True
        last = wait_for(lambda: (m := sub.last()) and m["status"] == "paused" and m, timeout=10, what="paused")
        assert last["updatedTime"] >= resumed["updatedTime"]
        away = Subscriber(broker)  # a worker that starts while the node is down is not sent to it
        try:
            retained = wait_for(lambda: away.last(), timeout=10, what="the retained message")
            assert retained["status"] == "paused" and retained["retain"] is True
        finally:
            away.close()
    finally:
        sub.close()
        if not stopped:
            d.stop()


def test_status_says_queued_only_while_a_claim_would_get_work_and_old_host_topics_are_cleared(
        ray_cluster, tmp_path, broker) -> None:
    """Before: a revalidate published queued, empty 7 ms later, then queued; due rows that were all
    leased kept queued retained until their leases ran out (every claim answered []); and the
    retained topic of the node's previous host name stayed, so the fleet kept polling it."""
    import ray

    from prerender_ray.actors.common import lookup
    from prerender_ray.storage.keys import QUEUE_STATUS
    from prerender_ray.storage.registry import encode_json
    from tests.support import claim, put_target, take

    old = Subscriber(broker)  # a retained message of this node under its previous host name
    old.client.publish("queue_status/old-host.example", json.dumps(
        {"hostname": "old-host.example", "status": "queued", "updatedTime": 1}), qos=1, retain=True).wait_for_publish(5)
    old.close()
    d = deploy_on(ray_cluster, tmp_path / "data", {"fleet": {"mqtt": {"url": f"mqtt://127.0.0.1:{broker}"}}})
    sub = Subscriber(broker)
    topic = "queue_status/127.0.0.1"
    try:
        wait_for(lambda: (m := sub.of(topic)) and m[-1]["status"] == "empty", timeout=30, what="empty")
        seen = len(sub.of(topic))
        keys = put_target(d.url, "https://flap.test/page", nextRenderTime=1)["cacheKeys"]
        wait_for(lambda: sub.of(topic)[-1]["status"] == "queued", timeout=10, what="queued")
        time.sleep(1.5)  # two publishes: a flap would show here
        assert [m["status"] for m in sub.of(topic)[seen:]] == ["queued"]
        take(d.url, keys)  # every due row is now leased: nothing to claim
        wait_for(lambda: sub.of(topic)[-1]["status"] == "empty", timeout=10, what="empty while all is in flight")
        assert claim(d.url) == []

        store = lookup("store", d.status["nodes"][0]["name"])
        node = d.status["nodes"][0]["name"]
        row = encode_json({"hostname": "old-host.example", "node": node, "status": "queued", "updatedTime": 1})
        ray.get(store.apply.remote([(QUEUE_STATUS + node.encode(), row)]))
        ray.kill(lookup("keeper", node), no_restart=False)  # restarted: it finds its previous host name
        wait_for(lambda: any(m.get("cleared") for m in sub.of("queue_status/old-host.example")), timeout=60,
                 what="the old host's topic cleared")
        late = Subscriber(broker)
        try:
            time.sleep(1)
            assert late.of("queue_status/old-host.example") == []  # nothing retained under it any more
        finally:
            late.close()
    finally:
        sub.close()
        d.stop()
