{#- Applied by tests/salt/test_salt_call.py with salt-call --local. The ext4
    volume's size comes from pillar so that one file serves every step. #}
{%- set ext4_size = salt['pillar.get']('sv_test:ext4_size', '64M') %}
ext4-data:
  sparse_volume.present:
    - size: {{ ext4_size }}

# mkfs.xfs refuses file systems below 300 MB.
xfs-data:
  sparse_volume.present:
    - size: 320M
    - fs_type: xfs

raw-block:
  sparse_volume.present:
    - size: 64M
    - mode: block
