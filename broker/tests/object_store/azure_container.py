"""Creates a blob container on an Azure Blob Storage emulator (Azurite):

    azure_container.py ENDPOINT CONTAINER

ENDPOINT is the emulator's blob service (`http://127.0.0.1:PORT`); the
request is signed with Azurite's well-known development account
(`devstoreaccount1`), Shared Key, standard library only. object_store
does not create containers, as it does not create S3 buckets. Prints
the HTTP status (201).
"""
import base64
import hashlib
import hmac
import sys
import urllib.request
from email.utils import formatdate

ACCOUNT = "devstoreaccount1"
# Azurite's published development key (not a secret).
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="

endpoint, container = sys.argv[1], sys.argv[2]
date = formatdate(usegmt=True)
version = "2021-08-06"
content_type = "application/octet-stream"
# VERB, Content-Encoding, -Language, -Length (empty for 0), -MD5,
# Content-Type, Date, If-Modified-Since, If-Match, If-None-Match,
# If-Unmodified-Since, Range; then the x-ms- headers and the resource
# (the account twice: the emulator's path-style URL).
to_sign = "\n".join(["PUT", "", "", "", "", content_type, "", "", "", "", "", ""]) + "\n"
to_sign += f"x-ms-date:{date}\nx-ms-version:{version}\n"
to_sign += f"/{ACCOUNT}/{ACCOUNT}/{container}\nrestype:container"
mac = hmac.new(base64.b64decode(KEY), to_sign.encode(), hashlib.sha256).digest()
req = urllib.request.Request(
    f"{endpoint}/{ACCOUNT}/{container}?restype=container", method="PUT", data=b""
)
req.add_header("Content-Type", content_type)
req.add_header("x-ms-date", date)
req.add_header("x-ms-version", version)
req.add_header("Authorization", f"SharedKey {ACCOUNT}:{base64.b64encode(mac).decode()}")
with urllib.request.urlopen(req, timeout=10) as r:
    print(r.status)
