;;; magent-store-loaddefs.el --- The autoloads of magent-store's commands  -*- lexical-binding: t; -*-

;; Copyright (C) 2026 The magent-store authors
;; SPDX-License-Identifier: GPL-3.0-or-later

;; Author: Seed 2a926889 maintainers <maintainers@users.noreply.a-seed-2a926889.example>
;; Maintainer: Seed 2a926889 maintainers <maintainers@users.noreply.a-seed-2a926889.example>
;; Keywords: tools, convenience
;; URL: https://github.com/jamie-cui/magent

;; This file is not part of GNU Emacs.

;; This program is free software: you can redistribute it and/or modify
;; it under the terms of the GNU General Public License as published by
;; the Free Software Foundation, either version 3 of the License, or
;; (at your option) any later version.

;; This program is distributed in the hope that it will be useful,
;; but WITHOUT ANY WARRANTY; without even the implied warranty of
;; MERCHANTABILITY or FITNESS FOR A PARTICULAR PURPOSE.  See the
;; GNU General Public License for more details.

;; You should have received a copy of the GNU General Public License
;; along with this program.  If not, see <https://www.gnu.org/licenses/>.

;;; Commentary:

;; Generated from the `;;;###autoload' cookies of the package's files by
;; `make autoloads'; do not edit it.  magent-store.el loads it, so that
;; (require 'magent-store) makes every command available from a
;; checkout or a pip installation too, as package.el's own autoloads do
;; for a package.  The adapter to magent is loaded when the mode is
;; first turned on, never by the core: the adapter requires the core,
;; and the core knows nothing of magent.

;;; Change Log:

;; 0.1.0: first release.

;;; Code:

(autoload 'magent-store-start "magent-store" nil t)
(autoload 'magent-store-stop "magent-store" nil t)
(autoload 'magent-store-restart "magent-store" nil t)
(autoload 'magent-store-export-session "magent-store-export" nil t)
(autoload 'magent-store-find-session "magent-store-find" nil t)
(autoload 'magent-store-idle-compact "magent-store-idle" nil t)
(autoload 'magent-store-install-backend "magent-store-install" nil t)
(autoload 'magent-store-export-for-magent "magent-store-magent-schema6" nil t)
(autoload 'magent-store-mode "magent-store-magent" nil t)
(autoload 'magent-store-relocate "magent-store-relocate" nil t)
(autoload 'magent-store-scan "magent-store-scan" nil t)
(autoload 'magent-store-scrub "magent-store-scan" nil t)
(autoload 'magent-store-search "magent-store-search" nil t)
(autoload 'magent-store-status "magent-store-status" nil t)
(autoload 'magent-store-record-timing "magent-store-timing")
(autoload 'magent-store-timing-report "magent-store-timing" nil t)

(provide 'magent-store-loaddefs)
;;; magent-store-loaddefs.el ends here
