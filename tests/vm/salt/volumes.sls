{#- Applied by tests/vm/config-management.sh with salt-ssh. UUIDs pinned, as
    a real state tree would; the ext4 volume's size comes from pillar so
    that one file serves every step. #}
{%- set ext4_size = salt['pillar.get']('sv_test:ext4_size', '64M') %}
salt-data:
  sparse_volume.present:
    - uuid: 9d4a6f5b-3e0a-4b8c-9f74-50c1ac4d8e63
    - size: {{ ext4_size }}
    - now: True

salt-raw:
  sparse_volume.present:
    - uuid: ae5b7a6c-4f1b-4c9d-8a85-61d2bd5e9f74
    - size: 64M
    - mode: block
    - now: True
