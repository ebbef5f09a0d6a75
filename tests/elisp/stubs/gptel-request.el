;;; gptel-request.el --- Stand-in for gptel in magent-store's tests  -*- lexical-binding: t; -*-

;;; Commentary:

;; magent requires gptel when its modules load.  gptel cannot be installed
;; on the test machines (it is neither a Debian package nor on PyPI), and
;; the code our tests drive (magent's ledger and sessions) never calls it.
;; This empty feature lets upstream magent load; it is on `load-path' only
;; when no real gptel is installed.

;;; Code:

(provide 'gptel-request)
;;; gptel-request.el ends here
