"""elasticslice control node: one bare-metal node with a public address, to run
`elasticslice run` (the Dask scheduler, the callback endpoint, the tarball publisher and
enrolment) for an elastic slice of other nodes.

Instructions:
Log in (the List View tab shows the ssh command), install elasticslice, copy your
cloudlab.pem and the passphrase file to ~/.ssl/, write ~/.protogeni/elasticslice.conf, then
run `elasticslice doctor` and `elasticslice run`: docs/cloudlab.md in the elasticslice
repository walks through each step.
"""
import geni.portal as portal
import geni.rspec.pg as pg

# CloudLab's standard images: UBUNTU24-64-STD has Python 3.12, which runs elasticslice.
IMAGE = "urn:publicid:IDN+emulab.net+image+emulab-ops//UBUNTU24-64-STD"

pc = portal.Context()
pc.defineParameter("hardware_type", "Hardware type (empty: any)",
                   portal.ParameterType.STRING, "",
                   longDescription="A small, common type is enough: m510 (Utah), c220g5 "
                                   "(Wisconsin), c6320 (Clemson).")
pc.defineParameter("image", "Disk image", portal.ParameterType.STRING, IMAGE)
params = pc.bindParameters()

request = pc.makeRequestRSpec()
node = request.RawPC("control")
node.disk_image = params.image
if params.hardware_type:
    node.hardware_type = params.hardware_type
# Bare-metal nodes at CloudLab's clusters sit on the control network, which is routed to
# the Internet: the node's hostname resolves to its public address, which the CM's callbacks,
# its tarball fetcher and the elastic nodes reach (docs/cloudlab.md, "Ports").
pc.printRequestRSpec(request)
